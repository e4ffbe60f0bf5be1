"""TF Serving's REST codec (``http.tfserving``): the documentation's own examples, the column
format and responses, every refusal.

Examples from tensorflow/serving ``g3doc/api_rest.md``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from livefit.server.http.protocol_common import RequestError
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
