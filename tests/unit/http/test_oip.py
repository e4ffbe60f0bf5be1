"""The Open Inference Protocol's REST codec (``http.oip``): the specification's own examples,
every refusal, the binary data extension, and tritonclient unchanged.

Examples from kserve/open-inference-protocol ``specification/protocol/inference_rest.md``.
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
from livefit.server.http.protocol_common import RequestError


def _body(document: Any) -> bytes:
    return json.dumps(document).encode()


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
