"""Label messages and prediction records: decoded, validated, or rejected with a reason.

Both arrive over MQTT from anyone who may publish on the broker, so both are checked as
strictly as sample messages, with the same decoder pieces (``codec``: size limit, any of
``formats.FORMATS`` by content type or first byte, numbers that fit float32, raw buffers, ranks
and shapes checked before numpy sees them). Everything wrong raises ``codec.Rejection`` with a
reason from ``codec.REASONS``; an exception nobody foresaw is ``Rejection("internal")``.

Labels (``livefit/<name>/labels``, README "Delayed labels"), JSON or msgpack:

- one: ``{"id": <id>, "y": <target>, "w"?: <number>, "ts"?: <epoch s>}``
- a batch: ``{"id": [<N ids>], "y": [<N targets>], "w"?: [<N numbers>], "ts"?: <epoch s>}``

Prediction records (``livefit/<name>/predictions``), written by serving processes
(``recorder``), msgpack: ``{"ids": [N], "x": <N inputs>, "p": <N outputs>, "version": [N ints],
"t": [N epoch s], "source": <str>}``; ``x`` and ``p`` are raw buffers in practice. A row whose
``x`` or ``p`` is not finite is left out and counted (``PredictionBatch.non_finite``), so one
bad row never costs the others of its message; a message with no finite row is rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codec import SampleSpec, decode_map
from .codec_fields import MAX_TS, optional_number, sample_weights, shape_targets, to_array
from .formats import MSGPACK, raw_buffer
from .label_ids import IdError, RowId, check_id, check_ids
from .rejection import Rejection, short

PREDICTIONS_CONTENT_TYPE = MSGPACK.content_type


@dataclass(frozen=True, slots=True)
class LabelBatch:
    """Valid labels: ``y`` (n, *target_shape), ``w`` (n,), one id per row."""

    ids: list[RowId]
    y: np.ndarray
    w: np.ndarray
    ts: float | None = None  # when the outcome was known, by the sender's clock


@dataclass(frozen=True, slots=True)
class PredictionBatch:
    """Valid prediction records: the rows served, what was answered, by which version, when."""

    ids: list[RowId]
    x: np.ndarray  # (n, *input_shape)
    p: np.ndarray  # (n, *output_shape)
    version: list[int]
    t: list[float]  # when each was served, epoch seconds of the serving process
    non_finite: int = 0  # rows of the message left out: NaN or infinity in their x or p


def decode_labels(payload: bytes, spec: SampleSpec, content_type: str | None = None) -> LabelBatch:
    """Decode a label message against ``spec``; raises nothing but ``Rejection``."""
    try:
        return _decode_labels(payload, spec, content_type)
    except Rejection:
        raise
    except Exception as exc:  # a bug; the message is still counted, reported and acknowledged
        raise Rejection("internal", f"{type(exc).__name__}: {short(exc)}") from exc


def decode_predictions(
    payload: bytes, spec: SampleSpec, output_shape: tuple[int, ...], content_type: str | None
) -> PredictionBatch:
    """Decode a prediction-record message; raises nothing but ``Rejection``."""
    try:
        return _decode_predictions(payload, spec, output_shape, content_type)
    except Rejection:
        raise
    except Exception as exc:
        raise Rejection("internal", f"{type(exc).__name__}: {short(exc)}") from exc


def encode_predictions(
    ids: list[RowId], x: np.ndarray, p: np.ndarray, version: list[int], t: list[float],
    source: str,
) -> bytes:  # fmt: skip
    """One prediction-record message (msgpack, raw float32 buffers)."""
    return MSGPACK.encode(
        {
            "ids": ids,
            "x": raw_buffer(x, "<f4"),
            "p": raw_buffer(p, "<f4"),
            "version": version,
            "t": t,
            "source": source,
        }
    )


def _decode_labels(payload: bytes, spec: SampleSpec, content_type: str | None) -> LabelBatch:
    document = decode_map(payload, spec, content_type, ("id", "y"))
    raw_ids = document["id"]
    batched = isinstance(raw_ids, list)
    n = len(raw_ids) if batched else 1
    if batched and n == 0:
        raise Rejection("bad_shape", "id is an empty list")
    if n > spec.max_samples:
        raise Rejection("too_many_samples", f"{n} labels exceeds max_samples_per_message")
    try:
        ids = check_ids(raw_ids, n, "id") if batched else [check_id(raw_ids, "id")]
    except IdError as exc:
        raise Rejection("bad_schema", str(exc)) from None
    y = to_array(document["y"], "y", spec.max_message_bytes)
    y = shape_targets(y, spec.target_shape, n, batched)
    if not np.isfinite(y).all():
        raise Rejection("non_finite", "y must be finite (no NaN or infinity)")
    w = sample_weights(document.get("w"), n, batched, spec.max_message_bytes)
    return LabelBatch(ids, y, w, optional_number(document, "ts"))


def _decode_predictions(
    payload: bytes, spec: SampleSpec, output_shape: tuple[int, ...], content_type: str | None
) -> PredictionBatch:
    document = decode_map(payload, spec, content_type, ("ids", "x", "p", "version", "t"))
    raw_ids = document["ids"]
    n = len(raw_ids) if isinstance(raw_ids, list) else 0
    if n == 0 or n > spec.max_samples:
        raise Rejection("bad_shape", f"ids must be a list of 1 to {spec.max_samples} ids")
    try:
        ids = check_ids(raw_ids, n)
    except IdError as exc:
        raise Rejection("bad_schema", str(exc)) from None
    x = _rows(document["x"], "x", spec.input_shape, n, spec.max_message_bytes)
    p = _rows(document["p"], "p", output_shape, n, spec.max_message_bytes)
    version = _per_row(document["version"], "version", n, integer=True)
    t = _per_row(document["t"], "t", n, integer=False)
    finite = np.isfinite(x.reshape(n, -1)).all(axis=1) & np.isfinite(p.reshape(n, -1)).all(axis=1)
    if not finite.any():
        raise Rejection("non_finite", "x and p must be finite (no NaN or infinity) in some row")
    keep = np.flatnonzero(finite).tolist()
    return PredictionBatch(
        [ids[i] for i in keep], x[finite], p[finite], [int(version[i]) for i in keep],
        [float(t[i]) for i in keep], non_finite=n - len(keep),
    )  # fmt: skip


def _rows(value: Any, name: str, shape: tuple[int, ...], n: int, limit: int) -> np.ndarray:
    array = to_array(value, name, limit)
    if array.shape != (n, *shape):
        raise Rejection(
            "bad_shape", f"{name} has shape {list(array.shape)}; expected {[n, *shape]}"
        )
    return array


def _per_row(value: Any, name: str, n: int, integer: bool) -> list[int | float]:
    values = value if isinstance(value, list) else [value] * n
    if len(values) != n:
        raise Rejection("length_mismatch", f"{name} has {len(values)} values for {n} ids")
    for item in values:
        if integer and not (type(item) is int and 0 <= item < 2**63):
            raise Rejection("bad_schema", f"{name} must hold integers from 0 to 2**63-1")
        if not integer and not (
            type(item) in (int, float) and 0 <= item <= MAX_TS and math.isfinite(item)
        ):
            raise Rejection("bad_schema", f"{name} must hold epoch seconds, 0 to {MAX_TS:g}")
    return values
