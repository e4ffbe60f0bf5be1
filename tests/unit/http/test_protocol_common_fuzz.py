"""Property-based fuzzing of the prediction API's request codecs: whatever body arrives, parsing
either gives finite float32 rows of the model's input shape or a RequestError with a 400 or
413 and a message that a UTF-8 JSON response can carry; it never raises anything else.

The trees hold what hostile or broken clients send: integers far beyond 64 bits (JSON has no
limit), 1e308, NaN, booleans among numbers, non-ASCII digit strings, lone surrogates, deep
nesting, OIP tensors with any shape, datatype, data and parameters, and binary-extension
header lengths that lie."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from livefit.server.http.oip import parse_oip
from livefit.server.http.oip_tensors import OIP_DATATYPES
from livefit.server.http.protocol_common import RequestError
from livefit.server.http.tfserving import parse_tfserving

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHAPES = [(2,), (1,), (2, 3)]
MAX_ROWS = 8

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 3.5e38, 70000.0, 2**63, 2**64, -(2**63) - 1]),
    st.text(max_size=6),
    st.text(alphabet="0123456789\u0661\u0663\uff11\u00b2\ud800.-e", min_size=1, max_size=6),
)
leaf = st.one_of(st.floats(-100, 100), st.integers(-100, 100), scalars)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=3)
    ),
    max_leaves=30,
)
rows = st.integers(min_value=1, max_value=3).flatmap(
    lambda width: st.lists(st.lists(leaf, min_size=width, max_size=width), min_size=1, max_size=4)
)
shapes = st.one_of(
    st.lists(st.integers(min_value=0, max_value=4), max_size=4),
    st.lists(st.sampled_from([0, 1, 2, 2**31, 2**62, 2**64, 10**400]), max_size=6),
    st.lists(st.just(1), min_size=30, max_size=120),
    values,
)
tensors = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.just("input"), st.text(alphabet="ab\ud800", max_size=3), values),
        "shape": shapes,
        "datatype": st.one_of(st.sampled_from(sorted(OIP_DATATYPES)), st.text(max_size=5)),
        "data": st.one_of(rows, st.lists(leaf, max_size=8), values),
        "parameters": st.one_of(
            st.fixed_dictionaries({"binary_data_size": st.one_of(st.integers(-8, 64), scalars)}),
            values,
        ),
    },
)


@st.composite
def plausible_tensors(draw: st.DrawFn) -> dict[str, Any]:
    """An input for shape [2] that is right but for what the leaves and parameters hold."""
    n = draw(st.integers(min_value=1, max_value=3))
    tensor = {
        "name": "input",
        "shape": [n, 2],
        "datatype": draw(st.sampled_from(sorted(OIP_DATATYPES))),
        "data": draw(st.lists(leaf, min_size=2 * n, max_size=2 * n)),
    }
    if draw(st.booleans()):
        tensor["data"] = [[True, False]] * n if tensor["datatype"] == "BOOL" else [[1, 2]] * n
    return tensor


oip_documents = st.fixed_dictionaries(
    {
        "inputs": st.one_of(
            st.lists(plausible_tensors(), min_size=1, max_size=1),
            st.lists(tensors, min_size=1, max_size=2),
            values,
        )
    },
    optional={
        "id": st.one_of(st.text(alphabet="ab\ud800\udfff", max_size=3), values),
        "parameters": st.one_of(st.fixed_dictionaries({"timeout": scalars}), values),
        "outputs": st.one_of(
            st.lists(st.fixed_dictionaries({"name": st.text(alphabet="o\udfff", max_size=3)})),
            values,
        ),
    },
)
tf_documents = st.one_of(
    st.fixed_dictionaries({"instances": st.one_of(rows, values)}),
    st.fixed_dictionaries({"inputs": st.one_of(rows, values, st.dictionaries(st.text(), rows))}),
    st.fixed_dictionaries(
        {"instances": st.lists(st.fixed_dictionaries({"x": st.one_of(st.lists(leaf), values)}))}
    ),
    values,
)


def encode(document: Any) -> bytes | None:
    try:
        return json.dumps(document).encode("utf-8", "surrogatepass")
    except (ValueError, OverflowError):  # more digits than Python prints
        return None


def leaves(tree: Any) -> list[Any]:
    if isinstance(tree, list):
        return [leaf for item in tree for leaf in leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in leaves(item)]
    return [tree]


def takes_booleans_only_as_bool(document: Any, parse: Any) -> None:
    """Accepted: TF Serving took no booleans; OIP took them only as datatype BOOL, alone."""
    if parse is parse_tfserving:
        inputs = document.get("instances", document.get("inputs"))
        assert not any(isinstance(v, bool) for v in leaves(inputs)), document
    else:
        (tensor,) = document["inputs"]
        data = leaves(tensor.get("data"))
        if tensor["datatype"] == "BOOL":
            assert all(isinstance(v, bool) for v in data), document
        else:
            assert not any(isinstance(v, bool) for v in data), document


def check(parse: Any, body: bytes, **kwargs: Any) -> None:
    for shape in SHAPES:
        try:
            parsed = parse(body, shape, MAX_ROWS, **kwargs)
        except RequestError as error:
            assert error.status in (400, 413)
            assert error.message and str(error) == error.message
            error.message.encode("utf-8")  # the JSON error response can carry it
            continue
        assert parsed.rows.dtype == np.float32
        assert parsed.rows.shape[1:] == shape and 1 <= len(parsed.rows) <= MAX_ROWS
        assert np.isfinite(parsed.rows).all()
        if parsed.request_id is not None:
            parsed.request_id.encode("utf-8")  # echoed in the response
        if "header_length" not in kwargs:
            takes_booleans_only_as_bool(json.loads(body), parse)


@FUZZ
@given(st.binary(max_size=300))
@example(b'{"instances": [[' + b"1" * 5000 + b", 1]]}")
@example(
    b'{"inputs": [{"name": "i", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], "x": -'
    + b"9" * 4400
    + b"}"
)
def test_random_bytes(body: bytes) -> None:
    check(parse_tfserving, body)
    check(parse_oip, body)
    check(parse_oip, body, header_length=len(body) // 2)


@FUZZ
@given(tf_documents)
@example({"instances": [[1e308, 1]]})
@example({"instances": [[True, 1]]})
@example({"instances": [[10**400, 1]]})
def test_tfserving_documents(document: Any) -> None:
    if (body := encode(document)) is not None:
        check(parse_tfserving, body)


@FUZZ
@given(oip_documents, st.one_of(st.none(), st.integers(-10, 10), st.binary(max_size=24)))
@example({"inputs": [{"name": "i", "shape": [1, 2**62, 0, 2**62], "datatype": "FP32"}]}, None)
@example(
    {
        "id": "\ud800",
        "inputs": [{"name": "i", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
    },
    None,
)
@example({"inputs": [{"name": "i", "shape": [1, 2], "datatype": "INT8", "data": [True, 2]}]}, None)
def test_oip_documents(document: Any, tail: int | bytes | None) -> None:
    if (body := encode(document)) is None:
        return
    if tail is None:
        check(parse_oip, body)
    elif isinstance(tail, int):  # a header length that lies by a few bytes either way
        check(parse_oip, body, header_length=len(body) + tail)
    else:  # binary tensor data after the JSON, with the right header length
        check(parse_oip, body + tail, header_length=len(body))
