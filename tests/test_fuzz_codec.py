"""Property-based fuzzing of the sample decoder: whatever arrives, it either yields samples that
fit the model exactly or a Rejection with a known reason; it never raises anything else."""

from __future__ import annotations

import json
import math

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livefit.server.codec import REASONS, DecodedMessage, Rejection, SampleSpec, decode_message

SPEC = SampleSpec(input_shape=(3,), target_shape=(1,), max_message_bytes=64 * 1024, max_samples=100)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=16),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=40,
)
numbers = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
row = st.lists(numbers, min_size=1, max_size=5)
documents = st.fixed_dictionaries(
    {"x": st.one_of(row, st.lists(row, max_size=4), values), "y": st.one_of(numbers, row, values)},
    optional={
        "w": st.one_of(numbers, values),
        "ts": values,
        "seq": values,
        "source": values,
        "id": values,
    },
)


def check(payload: bytes, content_type: str | None = None) -> None:
    try:
        decoded = decode_message(payload, SPEC, content_type)
    except Rejection as rejection:
        assert rejection.reason in REASONS
        return
    assert isinstance(decoded, DecodedMessage)
    chunk = decoded.chunk
    n = len(chunk)
    assert 1 <= n <= SPEC.max_samples
    assert chunk.x.shape == (n, 3) and chunk.y.shape == (n, 1) and chunk.w.shape == (n,)
    assert chunk.x.dtype == chunk.y.dtype == chunk.w.dtype == np.float32
    assert np.isfinite(chunk.x).all() and np.isfinite(chunk.y).all()
    assert np.isfinite(chunk.w).all() and (chunk.w >= 0).all()


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(payload: bytes) -> None:
    check(payload)
    check(payload, "application/json")
    check(payload, "application/msgpack")


@FUZZ
@given(documents)
def test_json_documents(document: dict[str, object]) -> None:
    try:
        payload = json.dumps(document, default=lambda b: b.hex()).encode()
    except (ValueError, OverflowError):
        return
    check(payload)


@FUZZ
@given(documents)
def test_msgpack_documents(document: dict[str, object]) -> None:
    try:
        payload = msgpack.packb(document)
    except (OverflowError, ValueError, TypeError):
        return
    check(payload)


@FUZZ
@given(
    st.sampled_from(["<f4", "<f8", "<i4", "<i8", "|u1", ">f4", "float32", "O"]),
    st.lists(st.integers(min_value=0, max_value=5), max_size=4),
    st.binary(max_size=200),
)
def test_raw_buffers(dtype: str, shape: list[int], data: bytes) -> None:
    check(msgpack.packb({"x": {"dtype": dtype, "shape": shape, "data": data}, "y": [1.0]}))


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
    ]:
        try:
            decode_message(payload, spec)
            raise AssertionError("accepted a message it should reject")
        except Rejection as rejection:
            assert rejection.reason in REASONS
