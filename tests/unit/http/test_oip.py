"""The prediction API's codecs: the specifications' own examples, every refusal, and tritonclient.

TF Serving examples come from tensorflow/serving ``g3doc/api_rest.md``; OIP examples from
kserve/open-inference-protocol ``specification/protocol/inference_rest.md``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from livefit.server.http.oip import format_oip, oip_model_metadata, parse_oip, triton_model_config
from livefit.server.http.oip_tensors import OIP_DATATYPES
from livefit.server.http.protocol_common import ParsedRequest, RequestError
from livefit.server.http.tfserving import format_tfserving, parse_tfserving, tfserving_model_status


def _body(document: Any) -> bytes:
    return json.dumps(document).encode()


def _nested(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def _refused(call: Any, *args: Any, **kwargs: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        call(*args, **kwargs)
    assert str(info.value) == info.value.message
    return info.value


def _triton_body(
    inputs: list[httpclient.InferInput], outputs: list[httpclient.InferRequestedOutput] | None
) -> tuple[bytes, int | None]:
    """The exact body (and Inference-Header-Content-Length) that InferenceServerClient.infer
    posts for these tensors."""
    return _get_inference_request(
        inputs=inputs,
        request_id="7",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=None,
    )


def _triton_result(response: dict[str, Any]) -> httpclient.InferResult:
    return httpclient.InferResult.from_response_body(json.dumps(response).encode())


# --- TF Serving: the documentation's examples --------------------------------------------------


def test_tfserving_doc_example_scalar_instances_feed_a_model_of_shape_1() -> None:
    parsed = parse_tfserving(b'{"instances": [1.0, 2.0, 5.0]}', [1], max_rows=10)

    assert parsed.rows.dtype == np.float32
    np.testing.assert_array_equal(parsed.rows, [[1.0], [2.0], [5.0]])
    assert (parsed.protocol, parsed.tf_format, parsed.input_name) == ("tfserving", "row", None)
    response = format_tfserving(parsed, parsed.rows / 2 + 3, version=123)
    assert response == {"predictions": [[3.5], [4.0], [5.5]], "model_version": "123"}


def test_tfserving_doc_example_list_of_two_tensors_of_shape_1x2() -> None:
    parsed = parse_tfserving(b'{"instances": [ [[1, 2]], [[3, 4]] ]}', [1, 2], max_rows=10)

    assert parsed.rows.shape == (2, 1, 2)
    np.testing.assert_array_equal(parsed.rows, [[[1, 2]], [[3, 4]]])


def test_tfserving_doc_example_string_instances_are_refused() -> None:
    error = _refused(parse_tfserving, b'{"instances": [ "foo", "bar", "baz" ]}', [1], 10)
    assert error.status == 400
    assert '"instances" holds strings; send numbers' in error.message


def test_tfserving_doc_example_three_named_inputs_as_printed_is_invalid_json() -> None:
    # The documentation's row example has a stray "]" after the second "signal".
    body = b"""{
     "instances": [
       {"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
       {"tag": "bar", "signal": [3, 4, 1, 2, 5]], "sensor": [[4, 5], [6, 8]]}
     ]
    }"""
    error = _refused(parse_tfserving, body, [5], 10)
    assert error.status == 400
    assert error.message.startswith("the body is not valid JSON")


def test_tfserving_doc_example_three_named_inputs_in_rows_are_refused() -> None:
    body = _body(
        {
            "instances": [
                {"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
                {"tag": "bar", "signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]},
            ]
        }
    )
    error = _refused(parse_tfserving, body, [5], 10)
    assert error.message == (
        "the model has one input, but each instance names 3: ['sensor', 'signal', 'tag']"
    )


def test_tfserving_doc_example_three_named_inputs_in_columns_are_refused() -> None:
    body = _body(
        {
            "inputs": {
                "tag": ["foo", "bar"],
                "signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],
                "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]],
            }
        }
    )
    error = _refused(parse_tfserving, body, [5], 10)
    assert error.message == (
        "the model has one input, but \"inputs\" names 3: ['sensor', 'signal', 'tag']"
    )


def test_tfserving_doc_examples_reduced_to_the_single_input_signal() -> None:
    rows = _body({"instances": [{"signal": [1, 2, 3, 4, 5]}, {"signal": [3, 4, 1, 2, 5]}]})
    columns = _body({"inputs": {"signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]]}})

    by_row = parse_tfserving(rows, [5], 10)
    by_column = parse_tfserving(columns, [5], 10)

    np.testing.assert_array_equal(by_row.rows, [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]])
    np.testing.assert_array_equal(by_column.rows, by_row.rows)
    assert (by_row.tf_format, by_row.input_name) == ("row", "signal")
    assert (by_column.tf_format, by_column.input_name) == ("col", "signal")


def test_tfserving_doc_status_example() -> None:
    assert tfserving_model_status(123, ready=True) == {
        "model_version_status": [
            {
                "version": "123",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }


# --- TF Serving: formats and responses -----------------------------------------------------------


def test_tfserving_column_format_answers_with_outputs() -> None:
    parsed = parse_tfserving(b'{"inputs": [[1, 2], [3, 4], [5, 6]]}', [2], 10)
    assert parsed.tf_format == "col"
    assert parsed.rows.shape == (3, 2)

    response = format_tfserving(parsed, np.array([[0.5], [1.5], [2.5]]), version=2)
    assert response == {"outputs": [[0.5], [1.5], [2.5]], "model_version": "2"}


def test_tfserving_column_scalars_feed_a_model_of_shape_1() -> None:
    parsed = parse_tfserving(b'{"inputs": [1.0, 2.0, 5.0]}', [1], 10)
    np.testing.assert_array_equal(parsed.rows, [[1.0], [2.0], [5.0]])


def test_tfserving_keeps_signature_name() -> None:
    body = b'{"signature_name": "serving_default", "instances": [[1, 2]]}'
    parsed = parse_tfserving(body, [2], 10)
    assert parsed.parameters == {"signature_name": "serving_default"}


def test_tfserving_multidimensional_outputs_keep_their_shape() -> None:
    parsed = parse_tfserving(b'{"instances": [[1], [2]]}', [1], 10)
    outputs = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    assert format_tfserving(parsed, outputs, 1)["predictions"] == outputs.tolist()


def test_tfserving_non_finite_predictions_are_a_422_naming_the_rows() -> None:
    """Issue 45 item 3: they were answered 200 with null (and recorded for delayed labels)."""
    parsed = parse_tfserving(b'{"instances": [[1], [2], [3]]}', [1], 10)
    error = _refused(format_tfserving, parsed, np.array([[1.0], [np.nan], [1e300]]), 1)
    assert error.status == 422
    assert error.message.startswith("the model's output for rows 1, 2 of 3 is not finite")
    assert "no prediction was answered or recorded" in error.message


def test_tfserving_status_while_loading() -> None:
    status = tfserving_model_status(None, ready=False)["model_version_status"]
    assert status == [
        {"version": "0", "state": "LOADING", "status": {"error_code": "OK", "error_message": ""}}
    ]


def test_format_refuses_outputs_that_do_not_match_the_rows() -> None:
    parsed = parse_tfserving(b'{"instances": [[1], [2]]}', [1], 10)
    with pytest.raises(ValueError, match="returned 3 rows of outputs for 2 input rows"):
        format_tfserving(parsed, np.zeros((3, 1)), 1)
    with pytest.raises(ValueError, match="returned a scalar of outputs for 2 input rows"):
        format_oip(parsed, np.float32(1.0), "m", 1)


# --- TF Serving: refusals -------------------------------------------------------------------------

TF_REFUSALS = [
    (b"not json", [2], "the body is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    (b"", [2], "the body is not valid JSON"),
    (b"\xff\xfe{", [2], "the body is not valid JSON"),
    (b"[[1, 2]]", [2], "the body must be a JSON object, not an array"),
    (b'"x"', [2], "the body must be a JSON object, not a string"),
    (b"{}", [2], 'needs exactly one of "instances" (row format) or "inputs" (column format)'),
    (b'{"instances": [[1, 2]], "inputs": [[1, 2]]}', [2], "needs exactly one of"),
    (b'{"instances": []}', [2], '"instances" must be a non-empty list, one entry per example'),
    (b'{"instances": {"x": [1, 2]}}', [2], '"instances" must be a non-empty list'),
    (
        b'{"instances": [[1, 2, 3]]}',
        [2],
        '"instances" has shape [1, 3], but each example must have shape [2] (expected [N, 2])',
    ),
    (
        b'{"instances": [1, 2]}',
        [2],
        '"instances" has shape [2]: each entry is one example, so send one example of shape [2] '
        "as a list of one (expected [N, 2])",
    ),
    (
        b'{"inputs": [[1, 2]]}',
        [3, 1],
        '"inputs" has shape [1, 2], but each example must have shape [3, 1] (expected [N, 3, 1])',
    ),
    (b'{"instances": [[1, 2], [3]]}', [2], '"instances" is ragged'),
    (b'{"instances": [[1, null]]}', [2], '"instances" holds null, objects or integers too large'),
    (b'{"instances": [[1, "2"]]}', [2], '"instances" holds strings; send numbers'),
    (b'{"instances": [[true, false]]}', [2], '"instances" holds true/false; send numbers'),
    (b'{"instances": [[1, NaN]]}', [2], '"instances" holds NaN or infinity; send finite numbers'),
    (b'{"inputs": [[1, -Infinity]]}', [2], '"inputs" holds NaN or infinity'),
    (b'{"instances": [[1, 1e300]]}', [2], '"instances" holds numbers too large for float32'),
    (b'{"instances": [[1, 100000000000000000000000]]}', [2], "integers too large"),
    (b'{"instances": [{"x": [1, 2]}, [3, 4]]}', [2], "every instance must be an object with"),
    (b'{"instances": [{"x": [1, 2]}, {"y": [3, 4]}]}', [2], "the same input name"),
    (b'{"inputs": 5}', [1], '"inputs" must be a list with one entry per example'),
    (b'{"inputs": []}', [2], '"inputs" holds no examples'),
    (b'{"inputs": {"x": []}}', [2], '"inputs" holds no examples'),
    (b'{"inputs": {}}', [2], 'the model has one input, but "inputs" names 0: []'),
    (
        _body({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}),
        [2],
        "(Open Inference Protocol requests go to the v2 API)",
    ),
    (b'{"signature_name": 1, "instances": [[1, 2]]}', [2], '"signature_name" must be a string'),
    (b"[" * 100_000 + b"]" * 100_000, [2], "the JSON body is nested too deeply"),
    # Python's int-from-string digit limit raised a bare ValueError out of the JSON parser.
    (b'{"instances": [[' + b"7" * 5000 + b", 1]]}", [2], "a number too long to read"),
    (b'{"instances": [[1, 2]], "x": -' + b"9" * 4301 + b"}", [2], "a number too long to read"),
    # Booleans are not numbers, alone or mixed with numbers (true was read as 1).
    (b'{"instances": [[true, 1]]}', [2], '"instances" holds true/false; send numbers'),
    (b'{"instances": [[1.5, 2], [3, false]]}', [2], '"instances" holds true/false'),
    (b'{"inputs": [[1, false]]}', [2], '"inputs" holds true/false; send numbers'),
    (b'{"inputs": {"x": [[true, 2.5]]}}', [2], '"inputs" holds true/false'),
    (b'{"instances": [{"x": [true, 2.5]}]}', [2], '"instances" holds true/false'),
    ('{"instances": [[1, "\u0663"]]}'.encode(), [2], '"instances" holds strings; send numbers'),
    (_body({"instances": [[1, 2]] * 2 + [[[1]]]}), [2], '"instances" is ragged'),
    (_body({"instances": _nested(1.0, 80)}), [2], '"instances" is nested more than 32 lists'),
]


@pytest.mark.parametrize(("body", "input_shape", "message"), TF_REFUSALS)
def test_tfserving_refusals_say_what_to_fix(
    body: bytes, input_shape: list[int], message: str
) -> None:
    error = _refused(parse_tfserving, body, input_shape, 10)
    assert error.status == 400
    assert message in error.message


@pytest.mark.parametrize(
    "body",
    [
        _body({"instances": [[1.0]] * 11}),
        _body({"inputs": [[1.0]] * 11}),
        _body({"inputs": {"x": [[1.0]] * 11}}),
        _body({"instances": [{"x": [1.0]}] * 11}),
    ],
)
def test_tfserving_more_rows_than_allowed_is_413(body: bytes) -> None:
    error = _refused(parse_tfserving, body, [1], 10)
    assert (error.status, error.message) == (
        413,
        "11 examples in one request; at most 10 are allowed",
    )


def test_tfserving_at_the_row_limit_is_accepted() -> None:
    assert parse_tfserving(_body({"instances": [[1.0]] * 10}), [1], 10).rows.shape == (10, 1)


# --- OIP: the specification's example -----------------------------------------------------------

OIP_SPEC_REQUEST = """{
  "id" : "42",
  "inputs" : [
    {
      "name" : "input0",
      "shape" : [ 2, 2 ],
      "datatype" : "UINT32",
      "data" : [ 1, 2, 3, 4 ]
    },
    {
      "name" : "input1",
      "shape" : [ 3 ],
      "datatype" : "BOOL",
      "data" : [ true ]
    }
  ],
  "outputs" : [
    {
      "name" : "output0"
    }
  ]
}"""


def test_oip_spec_example_with_two_inputs_is_refused_for_a_one_input_model() -> None:
    error = _refused(parse_oip, OIP_SPEC_REQUEST.encode(), [2], 10, output_name="output0")
    assert error.status == 400
    assert error.message == (
        'the model has one input ("input"), but the request sends 2: '
        "['input0', 'input1']; send one tensor"
    )


def test_oip_spec_example_adapted_to_one_input_of_shape_2() -> None:
    document = json.loads(OIP_SPEC_REQUEST)
    del document["inputs"][1]

    parsed = parse_oip(_body(document), [2], 10, input_name="input0", output_name="output0")

    np.testing.assert_array_equal(parsed.rows, [[1, 2], [3, 4]])
    assert parsed.rows.dtype == np.float32
    assert (parsed.protocol, parsed.tf_format) == ("oip", None)
    assert (parsed.input_name, parsed.request_id, parsed.output_names) == (
        "input0",
        "42",
        ["output0"],
    )
    outputs = np.array([[1.0, 1.1], [2.0, 2.1]], dtype=np.float32)
    response = format_oip(parsed, outputs, "mymodel", 3, output_name="output0")
    assert response == {
        "model_name": "mymodel",
        "model_version": "3",
        "id": "42",
        "outputs": [
            {
                "name": "output0",
                "shape": [2, 2],
                "datatype": "FP32",
                "data": outputs.reshape(-1).tolist(),
            }
        ],
    }


def test_oip_spec_example_asks_for_an_output_the_model_does_not_have() -> None:
    document = json.loads(OIP_SPEC_REQUEST)
    del document["inputs"][1]
    error = _refused(parse_oip, _body(document), [2], 10)
    assert error.message == 'unknown output "output0"; the model has one output, "output"'


def test_oip_spec_example_second_input_has_too_few_values() -> None:
    document = json.loads(OIP_SPEC_REQUEST)
    del document["inputs"][0]
    error = _refused(parse_oip, _body(document), [3], 10, output_name="output0")
    assert error.message == "inputs[0].data has 1 values, but shape [3] needs 3"


# --- OIP: accepted shapes, data and datatypes ----------------------------------------------------


def _oip(shape: list[int], data: Any, datatype: str = "FP32", **extra: Any) -> bytes:
    tensor = {"name": "input", "shape": shape, "datatype": datatype, "data": data}
    return _body({"inputs": [tensor], **extra})


@pytest.mark.parametrize(
    "data", [[1, 2, 3, 4, 5, 6], [[1, 2, 3], [4, 5, 6]], [[[1, 2, 3]], [[4, 5, 6]]]]
)
def test_oip_flat_and_nested_data_read_the_same(data: Any) -> None:
    parsed = parse_oip(_oip([2, 3], data), [3], 10)
    np.testing.assert_array_equal(parsed.rows, [[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("datatype", list(OIP_DATATYPES))
def test_oip_every_datatype_becomes_float32(datatype: str) -> None:
    data = [True, False, True, True] if datatype == "BOOL" else [1, 0, 2, 3]
    parsed = parse_oip(_oip([2, 2], data, datatype), [2], 10)

    assert parsed.rows.dtype == np.float32
    expected = [[1, 0], [1, 1]] if datatype == "BOOL" else [[1, 0], [2, 3]]
    np.testing.assert_array_equal(parsed.rows, expected)


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("INT8", [-128, 127], [-128, 127]),
        ("UINT64", [2**63, 2**64 - 1], [2.0**63, 2.0**64]),
        ("INT64", [-(2**63), 2**63 - 1], [-(2.0**63), 2.0**63]),
        ("FP16", [0.1, 65504], [np.float16(0.1), 65504]),
        ("FP64", [1e-3, -2.5], [1e-3, -2.5]),
        ("FP32", [1, 2.5], [1, 2.5]),
    ],
)
def test_oip_datatype_limits_and_rounding(
    datatype: str, data: list[Any], expected: list[Any]
) -> None:
    parsed = parse_oip(_oip([1, 2], data, datatype), [2], 10)
    np.testing.assert_array_equal(parsed.rows, np.array([expected], dtype=np.float32))


def test_oip_shape_equal_to_the_input_shape_is_one_row() -> None:
    parsed = parse_oip(_oip([2, 3], [1, 2, 3, 4, 5, 6]), [2, 3], 10)
    assert parsed.rows.shape == (1, 2, 3)


def test_oip_model_of_shape_1_takes_a_plain_batch() -> None:
    parsed = parse_oip(_oip([3], [1.0, 2.0, 5.0]), [1], 10)
    np.testing.assert_array_equal(parsed.rows, [[1.0], [2.0], [5.0]])


def test_oip_keeps_parameters_and_makes_a_fresh_id() -> None:
    parsed = parse_oip(_oip([1, 2], [1, 2], parameters={"priority": 1}), [2], 10)
    assert parsed.parameters == {"priority": 1}
    assert parsed.request_id is None and parsed.output_names is None

    first = format_oip(parsed, np.zeros((1, 1)), "m", 1)["id"]
    second = format_oip(parsed, np.zeros((1, 1)), "m", 1)["id"]
    assert re.fullmatch("[0-9a-f]{32}", first) and first != second


def test_oip_empty_outputs_list_asks_for_everything() -> None:
    assert parse_oip(_oip([1, 2], [1, 2], outputs=[]), [2], 10).output_names is None


def test_oip_format_checks_requested_names_against_its_output_name() -> None:
    parsed = parse_oip(_oip([1, 2], [1, 2], outputs=[{"name": "output"}]), [2], 10)
    error = _refused(format_oip, parsed, np.zeros((1, 1)), "m", 1, output_name="y")
    assert error.message == 'unknown output "output"; the model has one output, "y"'


def test_oip_non_finite_outputs_are_a_422() -> None:
    parsed = parse_oip(_oip([2, 1], [1, 2]), [1], 10)
    error = _refused(format_oip, parsed, np.array([[np.nan], [1.0]]), "m", 1)
    assert error.status == 422 and "output for row 0 of 2 is not finite" in error.message
    finite = format_oip(parsed, np.array([[0.5], [1.0]]), "m", 1)
    assert finite["outputs"][0]["data"] == [0.5, 1.0]
    json.dumps(finite, allow_nan=False)


def test_oip_model_metadata() -> None:
    assert oip_model_metadata("m", ["1", "2"], [8], [1]) == {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "livefit-keras",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1]}],
    }


# --- OIP: refusals --------------------------------------------------------------------------------


def _tensor(**fields: Any) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    tensor.update(fields)
    return {key: value for key, value in tensor.items() if value is not None}


OIP_REFUSALS = [
    ({}, '"inputs" must be a non-empty list of tensors'),
    ({"inputs": []}, '"inputs" must be a non-empty list of tensors'),
    ({"inputs": {"input": [1, 2]}}, '"inputs" must be a non-empty list of tensors'),
    (
        {"inputs": [_tensor(), _tensor(name="other")]},
        "the model has one input (\"input\"), but the request sends 2: ['input', 'other']",
    ),
    ({"inputs": [[1, 2]]}, 'inputs[0] must be an object with "name", "shape", "datatype"'),
    ({"inputs": [_tensor(name=None)]}, 'inputs[0].name must be a string, e.g. "input"'),
    ({"inputs": [_tensor(name=3)]}, "inputs[0].name must be a string"),
    ({"inputs": [_tensor(datatype=None)]}, "inputs[0].datatype is missing; use one of BOOL,"),
    ({"inputs": [_tensor(datatype="BYTES")]}, "inputs[0].datatype is 'BYTES'; use one of"),
    ({"inputs": [_tensor(datatype="fp32")]}, "inputs[0].datatype is 'fp32'"),
    ({"inputs": [_tensor(shape=None)]}, "inputs[0].shape must be a list of non-negative integers"),
    ({"inputs": [_tensor(shape=[1, -2])]}, "inputs[0].shape must be a list of non-negative"),
    ({"inputs": [_tensor(shape=[True, 2])]}, "inputs[0].shape must be a list of non-negative"),
    ({"inputs": [_tensor(shape="1,2")]}, "inputs[0].shape must be a list of non-negative"),
    (
        {"inputs": [_tensor(shape=[2, 7], data=[0] * 14)]},
        "inputs[0].shape [2, 7] does not match the model's input shape [2] (expected [N, 2])",
    ),
    (
        {"inputs": [_tensor(shape=[1, 1, 2], data=[1, 2])]},
        "inputs[0].shape [1, 1, 2] does not match the model's input shape [2]",
    ),
    ({"inputs": [_tensor(shape=[0, 2], data=[])]}, "inputs[0].shape [0, 2] holds no examples"),
    ({"inputs": [_tensor(data=None)]}, "inputs[0].data is missing"),
    (
        {"inputs": [_tensor(data=[1, 2, 3])]},
        "inputs[0].data has 3 values, but shape [1, 2] needs 2",
    ),
    ({"inputs": [_tensor(shape=[2, 2], data=[[1, 2], [3]])]}, "inputs[0].data is ragged"),
    ({"inputs": [_tensor(data=[1, "2"])]}, "inputs[0].data holds strings; send numbers"),
    ({"inputs": [_tensor(data=[1, None])]}, "inputs[0].data holds null, objects"),
    (
        {"inputs": [_tensor(data=[True, False])]},
        "inputs[0].data must hold numbers for datatype FP32",
    ),
    (
        {"inputs": [_tensor(datatype="INT32", data=[1, 2.5])]},
        "inputs[0].data must hold integers for datatype INT32",
    ),
    (
        {"inputs": [_tensor(datatype="BOOL", data=[1, 0])]},
        "inputs[0].data must hold true or false for datatype BOOL",
    ),
    (
        {"inputs": [_tensor(datatype="UINT8", data=[1, 256])]},
        "inputs[0].data holds values out of range for UINT8",
    ),
    (
        {"inputs": [_tensor(datatype="INT8", data=[-129, 0])]},
        "inputs[0].data holds values out of range for INT8",
    ),
    (
        {"inputs": [_tensor(datatype="UINT32", data=[-1, 0])]},
        "inputs[0].data holds values out of range for UINT32",
    ),
    (
        {"inputs": [_tensor(datatype="FP16", data=[1, 70000])]},
        "inputs[0].data holds values out of range for FP16",
    ),
    (
        {"inputs": [_tensor(datatype="FP64", data=[1, 1e300])]},
        "inputs[0].data holds numbers too large for float32",
    ),
    ({"inputs": [_tensor(data=[1, float("nan")])]}, "inputs[0].data holds NaN or infinity"),
    ({"inputs": [_tensor(data=[1, float("inf")])]}, "inputs[0].data holds NaN or infinity"),
    (
        {"inputs": [_tensor(parameters={"binary_data_size": 8})]},
        'inputs[0] has both "data" and parameters.binary_data_size; send one',
    ),
    (
        {"inputs": [_tensor(data=None, parameters={"binary_data_size": 8})]},
        "inputs[0] declares 8 bytes of binary data, but the body has 0 after the JSON header; "
        "binary tensor data after the JSON needs the Inference-Header-Content-Length header",
    ),
    (
        {"inputs": [_tensor(parameters={"shared_memory_region": "r"})]},
        "inputs[0].parameters.shared_memory_region is not supported",
    ),
    ({"inputs": [_tensor(parameters=[])]}, "inputs[0].parameters must be an object"),
    (
        {
            "inputs": [_tensor()],
            "outputs": [{"name": "output", "parameters": {"classification": 2}}],
        },
        "outputs[0].parameters.classification is not supported",
    ),
    ({"inputs": [_tensor()], "outputs": ["output"]}, '"outputs" must be a list of objects with'),
    ({"inputs": [_tensor()], "outputs": {"name": "output"}}, '"outputs" must be a list of'),
    (
        {"inputs": [_tensor()], "outputs": [{"name": "output"}, {"name": "probs"}]},
        'unknown output "probs"; the model has one output, "output"',
    ),
    ({"id": 42, "inputs": [_tensor()]}, '"id" must be a string'),
    ({"id": "\ud800", "inputs": [_tensor()]}, '"id" must be valid Unicode text'),
    ({"inputs": [_tensor(data=[True, 2])]}, "inputs[0].data must hold numbers for datatype FP32"),
    (
        {"inputs": [_tensor(datatype="INT32", data=[[1, True]])]},
        "inputs[0].data must hold integers for datatype INT32",
    ),
    (
        {"inputs": [_tensor(datatype="BOOL", data=[True, 1])]},
        "inputs[0].data must hold true or false for datatype BOOL",
    ),
    (
        {"inputs": [_tensor(shape=[1, 2**62, 0, 2**62], data=[])]},
        "inputs[0].shape [1, 4611686018427387904, 0, 4611686018427387904] does not match",
    ),
    ({"inputs": [_tensor(shape=[1] * 100 + [2])]}, "inputs[0].shape has 101 dimensions"),
    (
        {"inputs": [_tensor(data=None, parameters={"binary_data_size": 10**400})]},
        "inputs[0].parameters.binary_data_size is 1000000000",
    ),
    ({"parameters": [1], "inputs": [_tensor()]}, "parameters must be an object"),
]


def test_oip_input_with_another_name_is_refused_naming_the_input() -> None:
    """Triton refuses an input the model does not have; so does livefit (it took any name)."""
    for name in ("input0", "x", "INPUT", ""):
        error = _refused(parse_oip, _body({"inputs": [_tensor(name=name)]}), [2], 10)
        assert (error.status, error.message) == (
            400,
            f'unknown input "{name}"; the model has one input, "input"',
        )
    assert parse_oip(_body({"inputs": [_tensor(name="x")]}), [2], 10, "x").input_name == "x"


def test_triton_model_config() -> None:
    assert triton_model_config("m", [4, 3], [2], 16) == {
        "name": "m",
        "platform": "livefit-keras",
        "backend": "livefit",
        "max_batch_size": 16,
        "input": [
            {"name": "input", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4, 3]}
        ],
        "output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [2]}],
    }


@pytest.mark.parametrize(("document", "message"), OIP_REFUSALS)
def test_oip_refusals_say_what_to_fix(document: dict[str, Any], message: str) -> None:
    error = _refused(parse_oip, _body(document), [2], 10)
    assert error.status == 400
    assert message in error.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "the body is not valid JSON"),
        (b"[]", "the body must be a JSON object, not an array"),
        (b"null", "the body must be a JSON object, not null"),
    ],
)
def test_oip_refuses_bodies_that_are_not_json_objects(body: bytes, message: str) -> None:
    assert message in _refused(parse_oip, body, [2], 10).message


def test_oip_more_rows_than_allowed_is_413() -> None:
    error = _refused(parse_oip, _oip([11, 2], [0] * 22), [2], 10)
    assert (error.status, error.message) == (
        413,
        "11 examples in one request; at most 10 are allowed",
    )


# --- OIP: binary data extension -------------------------------------------------------------------


def test_oip_binary_body_without_its_header_length_names_the_header() -> None:
    x = np.ones((2, 2), dtype=np.float32)
    tensor = httpclient.InferInput("input", [2, 2], "FP32").set_data_from_numpy(x)
    body, json_size = _triton_body([tensor], None)
    assert json_size is not None

    error = _refused(parse_oip, body, [2], 10)
    assert error.message.startswith("the body is not valid JSON")
    assert error.message.endswith("needs the Inference-Header-Content-Length header")


def _binary(document: dict[str, Any], tail: bytes) -> tuple[bytes, int]:
    header = _body(document)
    return header + tail, len(header)


@pytest.mark.parametrize(
    ("document", "tail", "header_length", "message"),
    [
        (
            {"inputs": [_tensor(data=None, parameters={"binary_data_size": 4})]},
            b"\0" * 4,
            None,
            "inputs[0].parameters.binary_data_size is 4, but 2 FP32 values take 8 bytes",
        ),
        (
            {"inputs": [_tensor(data=None, parameters={"binary_data_size": "8"})]},
            b"\0" * 8,
            None,
            "inputs[0].parameters.binary_data_size is '8', but 2 FP32 values take 8 bytes",
        ),
        (
            {"inputs": [_tensor(data=None, parameters={"binary_data_size": 8})]},
            b"\0" * 12,
            None,
            "inputs[0] declares 8 bytes of binary data, but the body has 12 after the JSON header",
        ),
        (
            {"inputs": [_tensor()]},
            b"\0" * 8,
            None,
            "the body has 8 bytes after the JSON header, but inputs[0] does not declare "
            "parameters.binary_data_size",
        ),
        (
            {"inputs": [_tensor()]},
            b"",
            10_000,
            "Inference-Header-Content-Length is 10000, but the body has",
        ),
        ({"inputs": [_tensor()]}, b"", -1, "Inference-Header-Content-Length is -1"),
    ],
)
def test_oip_binary_refusals(
    document: dict[str, Any], tail: bytes, header_length: int | None, message: str
) -> None:
    body, length = _binary(document, tail)
    error = _refused(parse_oip, body, [2], 10, header_length=header_length or length)
    assert error.status == 400
    assert message in error.message


def test_oip_binary_bool_reads_any_non_zero_byte_as_true() -> None:
    tensor = _tensor(datatype="BOOL", data=None, parameters={"binary_data_size": 2})
    body, length = _binary({"inputs": [tensor]}, b"\x00\x07")
    parsed = parse_oip(body, [2], 10, header_length=length)
    np.testing.assert_array_equal(parsed.rows, [[0.0, 1.0]])


# --- tritonclient, unchanged ----------------------------------------------------------------------


def test_tritonclient_json_round_trip() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2) / 4
    tensor = httpclient.InferInput("input", [3, 2], "FP32").set_data_from_numpy(
        x, binary_data=False
    )
    requested = httpclient.InferRequestedOutput("output", binary_data=False)
    body, json_size = _triton_body([tensor], [requested])
    assert json_size is None

    parsed = parse_oip(body, [2], 10)
    assert (parsed.request_id, parsed.output_names) == ("7", ["output"])
    np.testing.assert_array_equal(parsed.rows, x)

    y = parsed.rows.sum(axis=1, keepdims=True)
    result = _triton_result(format_oip(parsed, y, "m", 5))
    np.testing.assert_array_equal(result.as_numpy("output"), y)
    assert result.get_response()["id"] == "7"


def test_tritonclient_default_request_asks_for_binary_output_and_reads_json() -> None:
    x = np.array([[1.5, -2.0]], dtype=np.float32)
    tensor = httpclient.InferInput("input", [1, 2], "FP32").set_data_from_numpy(
        x, binary_data=False
    )
    body, _ = _triton_body([tensor], None)

    parsed = parse_oip(body, [2], 10)
    assert parsed.parameters == {"binary_data_output": True}

    y = np.array([[0.5, 3.0]], dtype=np.float32)
    result = _triton_result(format_oip(parsed, y, "m", 1))
    np.testing.assert_array_equal(result.as_numpy("output"), y)


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64", "INT64", "UINT8", "BOOL"])
def test_tritonclient_binary_inputs(datatype: str) -> None:
    dtype = OIP_DATATYPES[datatype]
    x = (np.arange(8).reshape(4, 2) % 3).astype(dtype)
    tensor = httpclient.InferInput("input", [4, 2], datatype).set_data_from_numpy(x)
    body, json_size = _triton_body([tensor], [httpclient.InferRequestedOutput("output")])

    parsed = parse_oip(body, [2], 10, header_length=json_size)

    np.testing.assert_array_equal(parsed.rows, x.astype(np.float32))
    result = _triton_result(format_oip(parsed, parsed.rows[:, :1], "m", 1))
    np.testing.assert_array_equal(result.as_numpy("output"), x[:, :1].astype(np.float32))


def test_parsed_request_is_a_frozen_message() -> None:
    parsed = ParsedRequest(rows=np.zeros((1, 1), dtype=np.float32), protocol="oip")
    with pytest.raises(AttributeError):
        parsed.protocol = "tfserving"
    assert parsed.parameters == {} and parsed.tf_format is None
