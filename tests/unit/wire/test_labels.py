"""The label and prediction-record decoders (``wire.labels``), property-based: whatever arrives
ends a list of labels or records, or a rejection with its reason, never another exception."""

from __future__ import annotations

import contextlib
import json

import msgpack
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from livefit.server.wire.codec import SampleSpec
from livefit.server.wire.label_ids import key_of
from livefit.server.wire.labels import decode_labels, decode_predictions
from livefit.server.wire.rejection import REASONS, Rejection
from tests.unit.wire.test_codec_fuzz import (
    FUZZ,
    SPEC,
    SPECS,
    batch,
    numbers,
    raw_buffers,
    row,
    scalars,
    values,
)

ids = st.one_of(
    st.text(max_size=300),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.lists(st.one_of(st.text(max_size=20), st.integers(-5, 5), scalars), max_size=6),
    values,
)


label_documents = st.fixed_dictionaries(
    {"id": ids, "y": st.one_of(numbers, row, batch, raw_buffers, values)},
    optional={
        "w": st.one_of(numbers, row, raw_buffers, values),
        "ts": st.one_of(st.floats(min_value=0, max_value=2e9), values),
    },
)


record_documents = st.fixed_dictionaries(
    {
        "ids": ids,
        "x": st.one_of(row, batch, raw_buffers, values),
        "p": st.one_of(row, batch, raw_buffers, values),
        "version": st.one_of(st.integers(-1, 2**64), st.lists(st.integers(-1, 10), max_size=5)),
        "t": st.one_of(numbers, st.lists(st.one_of(numbers, scalars), max_size=5), values),
    }
)


def check_labels(payload: bytes, spec: SampleSpec = SPEC, content_type: str | None = None) -> None:
    try:
        decoded = decode_labels(payload, spec, content_type)
    except Rejection as rejection:
        assert rejection.reason in REASONS and rejection.reason != "internal", rejection.detail
        assert rejection.detail and len(rejection.detail) <= 400
        return
    n = len(decoded.ids)
    assert 1 <= n <= spec.max_samples and len({key_of(i) for i in decoded.ids}) == n
    assert decoded.y.shape == (n, *spec.target_shape) and decoded.w.shape == (n,)
    assert np.isfinite(decoded.y).all() and np.isfinite(decoded.w).all() and (decoded.w >= 0).all()
    for row_id in decoded.ids:
        assert (type(row_id) is int and -(2**63) <= row_id < 2**63) or (
            type(row_id) is str and len(row_id.encode()) <= 256
        )


def check_records(payload: bytes, spec: SampleSpec = SPEC, content_type: str | None = None) -> None:
    output_shape = spec.target_shape or (2,)
    try:
        decoded = decode_predictions(payload, spec, output_shape, content_type)
    except Rejection as rejection:
        assert rejection.reason in REASONS and rejection.reason != "internal", rejection.detail
        return
    n = len(decoded.ids)
    assert decoded.x.shape == (n, *spec.input_shape) and decoded.p.shape == (n, *output_shape)
    assert len(decoded.version) == len(decoded.t) == n


@FUZZ
@given(st.binary(max_size=512))
def test_label_decoders_take_random_bytes(payload: bytes) -> None:
    check_labels(payload)
    check_records(payload)


@FUZZ
@given(label_documents)
def test_label_documents(document: dict[str, object]) -> None:
    for spec in SPECS:
        for payload, content_type in _payloads(document):
            check_labels(payload, spec, content_type)


@FUZZ
@given(record_documents)
def test_prediction_record_documents(document: dict[str, object]) -> None:
    for spec in SPECS:
        for payload, content_type in _payloads(document):
            check_records(payload, spec, content_type)


def _payloads(document: dict[str, object]) -> list[tuple[bytes, str]]:
    """The document as JSON and as msgpack, where each can hold it."""
    found = []
    with contextlib.suppress(ValueError, OverflowError):  # more digits than Python prints
        found.append((json.dumps(document, default=lambda b: b.hex()).encode(), "application/json"))
    with contextlib.suppress(OverflowError, ValueError, TypeError):  # beyond msgpack's integers
        found.append((msgpack.packb(document), "application/msgpack"))
    return found
