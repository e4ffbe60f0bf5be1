"""Property-based fuzzing of the sample decoder (``wire.codec``; the label decoders reuse these
strategies in ``test_labels.py``): whatever arrives, it either yields samples that fit the model
exactly or a Rejection with a known reason; it never raises anything else.

The trees hold what hostile or broken publishers send: integers far beyond 64 bits, floats at
the edge of float64, NaN, booleans inside number lists, non-ASCII digits, deep nesting, and
msgpack raw-buffer maps with any dtype, shape and data."""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from livefit.server.wire.codec import DecodedMessage, SampleSpec, decode_message
from livefit.server.wire.formats import RAW_DTYPES
from livefit.server.wire.rejection import REASONS, Rejection

SPEC = SampleSpec(input_shape=(3,), target_shape=(1,), max_message_bytes=64 * 1024, max_samples=100)
SPECS = [
    SPEC,
    SampleSpec(input_shape=(2, 2), target_shape=(), max_message_bytes=64 * 1024, max_samples=10),
    SampleSpec(input_shape=(1,), target_shape=(2,), max_message_bytes=4096, max_samples=5),
]
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

non_ascii_digits = st.text(
    alphabet="0123456789\u0660\u0661\u0663\u06f5\u0966\u09e7\uff11\uff19\u00b2\u00b9\u2153-+.eE",
    min_size=1,
    max_size=8,
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**39]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 3.5e38, 1e-320, math.nan, math.inf]),
    st.text(max_size=8),
    non_ascii_digits,
    st.binary(max_size=16),
)
shapes = st.one_of(
    st.lists(st.integers(min_value=0, max_value=6), max_size=4),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=6),
    st.lists(st.sampled_from([0, 1, 2, 3, 2**31, 2**62, 2**63 - 1]), max_size=100),
    st.lists(st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1), scalars), max_size=4),
    scalars,
)
raw_buffers = st.fixed_dictionaries(
    {
        "dtype": st.one_of(
            st.sampled_from(sorted(RAW_DTYPES)),
            st.sampled_from([">f4", "float32", "O", "<U4", "V8", "<M8", "<c8", ""]),
            st.lists(st.just("<f4"), max_size=1),
            st.none(),
        ),
        "shape": shapes,
        "data": st.one_of(st.binary(max_size=64), scalars),
    }
)
values = st.recursive(
    st.one_of(scalars, raw_buffers),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=40,
)
deep = st.integers(min_value=1, max_value=200).map(lambda depth: _nest(1.0, depth))
numbers = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
# Mostly plausible numbers, now and then anything at all: a bool, a huge int, NaN, a string.
leaf = st.one_of(numbers, numbers, st.integers(min_value=-100, max_value=100), scalars)
row = st.lists(leaf, min_size=1, max_size=4)
batch = st.integers(min_value=1, max_value=4).flatmap(
    lambda width: st.lists(st.lists(leaf, min_size=width, max_size=width), max_size=5)
)
documents = st.fixed_dictionaries(
    {
        "x": st.one_of(row, batch, raw_buffers, values, deep),
        "y": st.one_of(numbers, row, batch, raw_buffers, values),
    },
    optional={
        "w": st.one_of(numbers, row, raw_buffers, values),
        "ts": st.one_of(st.floats(min_value=0, max_value=2e9), values),
        "seq": st.one_of(st.integers(min_value=0, max_value=2**63 - 1), values),
        "source": st.one_of(st.text(max_size=300), values),
        "id": st.one_of(st.text(max_size=300), values),
    },
)

TS_401_DIGITS = {"x": [1.0, 2.0, 3.0], "y": [1.0], "ts": 10**400}
SHAPE_OVERFLOW = {"x": {"dtype": "<f4", "shape": [0, 2**62, 2**62], "data": b""}, "y": [1.0]}
RANK_100 = {"x": {"dtype": "<f4", "shape": [1] * 100, "data": b"\0" * 4}, "y": [1.0]}


def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def check(payload: bytes, spec: SampleSpec = SPEC, content_type: str | None = None) -> None:
    try:
        decoded = decode_message(payload, spec, content_type)
    except Rejection as rejection:
        assert rejection.reason in REASONS
        assert rejection.reason != "internal", rejection.detail  # every cause is foreseen
        assert rejection.detail and len(rejection.detail) <= 400
        return
    assert isinstance(decoded, DecodedMessage)
    chunk = decoded.chunk
    n = len(chunk)
    assert 1 <= n <= spec.max_samples
    assert chunk.x.shape == (n, *spec.input_shape)
    assert chunk.y.shape == (n, *spec.target_shape) and chunk.w.shape == (n,)
    assert chunk.x.dtype == chunk.y.dtype == chunk.w.dtype == np.float32
    assert np.isfinite(chunk.x).all() and np.isfinite(chunk.y).all()
    assert np.isfinite(chunk.w).all() and (chunk.w >= 0).all()
    assert decoded.seq is None or (type(decoded.seq) is int and 0 <= decoded.seq < 2**63)
    assert chunk.published_at is None or (
        type(chunk.published_at) is float and math.isfinite(chunk.published_at)
    )
    for text in (decoded.id, decoded.source):
        assert text is None or (isinstance(text, str) and len(text) <= 256)


def check_all_specs(payload: bytes, content_type: str | None = None) -> None:
    for spec in SPECS:
        check(payload, spec, content_type)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(payload: bytes) -> None:
    check(payload)
    check(payload, SPEC, "application/json")
    check(payload, SPEC, "application/msgpack")


@FUZZ
@given(documents)
@example(TS_401_DIGITS)
@example({"x": [True, 1.0, 1.0], "y": [1.0]})
@example({"x": [[1.0, 2.0, 3.0]], "y": [[1.0]], "w": [1e308], "seq": 10**400})
def test_json_documents(document: dict[str, object]) -> None:
    try:
        payload = json.dumps(document, default=lambda b: b.hex()).encode()
    except (ValueError, OverflowError):  # more digits than Python prints
        return
    check_all_specs(payload)


@FUZZ
@given(documents)
@example(SHAPE_OVERFLOW)
@example(RANK_100)
@example({"x": [1.0, 2.0, 3.0], "y": {"dtype": "<f4", "shape": [1] * 65, "data": b"\0" * 4}})
@example({"x": {"dtype": ["<f4"], "shape": [3], "data": b"\0" * 12}, "y": [1.0]})
@example({"x": [1.0, 2.0, 3.0], "y": [1.0], "seq": 2**64 - 1, "ts": -(2**63)})
def test_msgpack_documents(document: dict[str, object]) -> None:
    try:
        payload = msgpack.packb(document)
    except (OverflowError, ValueError, TypeError):  # integers msgpack cannot hold
        return
    check_all_specs(payload)


@FUZZ
@given(raw_buffers, raw_buffers, st.one_of(st.none(), raw_buffers))
@example(SHAPE_OVERFLOW["x"], [1.0], None)
def test_raw_buffers(x: dict[str, Any], y: Any, w: dict[str, Any] | None) -> None:
    document: dict[str, Any] = {"x": x, "y": y}
    if w is not None:
        document["w"] = w
    try:
        payload = msgpack.packb(document)
    except (OverflowError, ValueError, TypeError):
        return
    check_all_specs(payload)


@FUZZ
@given(
    st.sampled_from(sorted(RAW_DTYPES)),
    st.integers(min_value=1, max_value=4),
    st.binary(min_size=0, max_size=96),
)
def test_well_formed_raw_buffers_of_any_bytes(dtype: str, n: int, data: bytes) -> None:
    """Right dtype and shape, arbitrary bytes (NaN, infinity, subnormals, huge integers)."""
    size = n * 3 * np.dtype(dtype).itemsize
    data = (data * (size // max(len(data), 1) + 1))[:size] if data else bytes(size)
    x = {"dtype": dtype, "shape": [n, 3], "data": data}
    w = {"dtype": dtype, "shape": [n], "data": data[: n * np.dtype(dtype).itemsize]}
    check(msgpack.packb({"x": x, "y": [[1.0]] * n}))
    check(msgpack.packb({"x": [[1.0, 2.0, 3.0]] * n, "y": x | {"shape": [n, 3, 1]}, "w": w}))


@st.composite
def nearly_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid batch for SPEC with one field, or one value inside x, y or w, made hostile."""
    n = draw(st.integers(min_value=1, max_value=4))
    document: dict[str, Any] = {
        "x": draw(st.lists(st.lists(numbers, min_size=3, max_size=3), min_size=n, max_size=n)),
        "y": draw(st.lists(st.lists(numbers, min_size=1, max_size=1), min_size=n, max_size=n)),
        "w": draw(st.lists(st.floats(0, 10), min_size=n, max_size=n)),
        "ts": draw(st.floats(min_value=0, max_value=2e9)),
        "seq": draw(st.integers(min_value=0, max_value=2**63 - 1)),
        "source": draw(st.text(max_size=20)),
        "id": draw(st.text(max_size=20)),
    }
    key = draw(st.sampled_from(sorted(document)))
    hostile = draw(st.one_of(scalars, raw_buffers, values))
    if key in ("x", "y", "w") and draw(st.booleans()):
        target = document[key][draw(st.integers(0, n - 1))]
        if isinstance(target, list):
            target[draw(st.integers(0, len(target) - 1))] = hostile
        else:
            document[key][0] = hostile
    elif draw(st.booleans()):
        document[key] = hostile
    return document


@FUZZ
@given(nearly_valid())
@example({"x": [[1.0, 2.0, 3.0]], "y": [[1.0]], "ts": 10**400})
@example({"x": [[True, 2.0, 3.0]], "y": [[1.0]]})
def test_one_hostile_value_in_a_valid_message(document: dict[str, Any]) -> None:
    for encode in (json.dumps, msgpack.packb):
        try:
            payload = encode(document)
        except (OverflowError, ValueError, TypeError):
            continue
        check(payload if isinstance(payload, bytes) else payload.encode())


def test_the_reported_cases_are_rejections_not_crashes() -> None:
    """The three reports: ts with 401 digits, a raw shape whose product overflows, rank 100."""
    for payload, reason in [
        (json.dumps(TS_401_DIGITS).encode(), "bad_schema"),
        (msgpack.packb(SHAPE_OVERFLOW), "bad_shape"),
        (msgpack.packb(RANK_100), "bad_shape"),
    ]:
        try:
            decode_message(payload, SPEC)
            raise AssertionError("accepted a message it should reject")
        except Rejection as rejection:
            assert rejection.reason == reason, rejection.detail


def test_giant_and_deep_inputs_are_rejected_fast() -> None:
    giant = json.dumps({"x": [[0.5, 0.5, 0.5]] * 10_000, "y": [[1.0]] * 10_000}).encode()
    with_limit = SampleSpec(
        input_shape=(3,), target_shape=(1,), max_message_bytes=len(giant) + 1, max_samples=100
    )
    for payload, spec in [
        (giant, SPEC),
        (giant, with_limit),
        (b"[" * 200_000, SPEC),
        (msgpack.packb({"x": [[math.inf, 0, 0]], "y": [1]}), SPEC),
        (msgpack.packb({"x": _nest(1.0, 500), "y": [1]}), SPEC),
    ]:
        try:
            decode_message(payload, spec)
            raise AssertionError("accepted a message it should reject")
        except Rejection as rejection:
            assert rejection.reason in REASONS
