"""Decode and validate one MQTT sample message against a model's declared shapes.

The payload contract (README "MQTT payloads"): a map in one of ``formats.FORMATS`` (JSON,
msgpack) with ``x`` and ``y``, and optional ``w``, ``id``, ``ts``, ``source``, ``seq``,
``epoch`` (a publisher run's number: its ``seq`` counts within it). A single sample's ``x`` has
the model's input shape; a batch's ``x`` has one more leading dimension. In a binary format
(msgpack) any of ``x``, ``y``, ``w`` may be a raw little-endian buffer
``{"dtype": "<f4", "shape": [...], "data": <bytes>}``.

Everything wrong with a message raises ``Rejection`` with a reason from ``REASONS`` (a bounded
set, used as a metric label) and a detail for the dead-letter report. Nothing else escapes:
numbers, ranks, dimensions and sizes are checked before numpy or ``float`` sees them, booleans
are not numbers, and an exception nobody foresaw (a bug) becomes ``Rejection("internal")``
naming it, so a message can never stop or wedge the ingest worker.

The fields are decoded by ``codec_fields``; ``Rejection`` and ``REASONS`` are ``rejection``'s,
re-exported here for the modules that import them from the codec.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codec_fields import (
    optional_int,
    optional_number,
    optional_str,
    sample_weights,
    shape_targets,
    to_array,
)
from .formats import format_of
from .rejection import Rejection, short
from .samples import SampleChunk


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """What a model accepts: shapes of one input and one target, and message limits."""

    input_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    max_message_bytes: int = 1024 * 1024
    max_samples: int = 10_000


@dataclass(frozen=True, slots=True)
class DecodedMessage:
    """A valid message: its samples plus the publisher's optional identifiers."""

    chunk: SampleChunk
    id: str | None = None
    source: str | None = None
    seq: int | None = None
    epoch: int | None = None  # the publisher's run: its seq numbers count within it


def decode_message(
    payload: bytes, spec: SampleSpec, content_type: str | None = None
) -> DecodedMessage:
    """Decode ``payload`` (JSON or msgpack) and check it against ``spec``; raise Rejection.

    Raises nothing but Rejection: an unforeseen exception is ``Rejection("internal")``.
    """
    try:
        return _decode(payload, spec, content_type)
    except Rejection:
        raise
    except Exception as exc:  # a bug; the message is still counted, reported and acknowledged
        raise Rejection("internal", f"{type(exc).__name__}: {short(exc)}") from exc


def decode_map(
    payload: bytes, spec: SampleSpec, content_type: str | None, keys: tuple[str, ...]
) -> dict[str, Any]:
    """The message's top-level map, holding every key in ``keys``: what every message kind
    (samples, labels, prediction records) starts with; a ``Rejection`` otherwise."""
    if len(payload) > spec.max_message_bytes:
        raise Rejection(
            "too_large", f"{len(payload)} bytes exceeds max_message_bytes={spec.max_message_bytes}"
        )
    document = _parse(payload, content_type)
    if not isinstance(document, dict):
        wanted, got = " and ".join(keys), type(document).__name__
        raise Rejection("bad_schema", f"expected a map with {wanted}, got {got}")
    for key in keys:
        if key not in document:
            raise Rejection("bad_schema", f'missing "{key}"')
    return document


def _decode(payload: bytes, spec: SampleSpec, content_type: str | None) -> DecodedMessage:
    document = decode_map(payload, spec, content_type, ("x", "y"))
    x = to_array(document["x"], "x", spec.max_message_bytes)
    y = to_array(document["y"], "y", spec.max_message_bytes)
    x, batched = _shape_inputs(x, spec)
    n = x.shape[0]
    if n > spec.max_samples:
        raise Rejection("too_many_samples", f"{n} samples exceeds max_samples_per_message")
    y = shape_targets(y, spec.target_shape, n, batched)
    w = sample_weights(document.get("w"), n, batched, spec.max_message_bytes)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise Rejection("non_finite", "x and y must be finite (no NaN or infinity)")
    published_at = optional_number(document, "ts")
    chunk = SampleChunk(x=x, y=y, w=w, published_at=published_at, received_at=time.time())
    return DecodedMessage(
        chunk=chunk,
        id=optional_str(document, "id"),
        source=optional_str(document, "source"),
        seq=optional_int(document, "seq"),
        epoch=optional_int(document, "epoch"),
    )


def _parse(payload: bytes, content_type: str | None) -> Any:
    wire_format = format_of(payload, content_type)
    try:
        return wire_format.decode(payload)
    except RecursionError:
        raise Rejection("undecodable", f"{wire_format.name} nested too deeply") from None
    except Exception as exc:  # any format's errors, and UnicodeDecodeError, land here
        raise Rejection("undecodable", f"invalid {wire_format.name}: {short(exc)}") from None


def _shape_inputs(x: np.ndarray, spec: SampleSpec) -> tuple[np.ndarray, bool]:
    rank = len(spec.input_shape)
    if x.ndim == rank and x.shape == spec.input_shape:
        return x[np.newaxis], False
    if x.ndim == rank + 1 and x.shape[1:] == spec.input_shape:
        if x.shape[0] == 0:
            raise Rejection("bad_shape", "x is an empty batch")
        return x, True
    expected = list(spec.input_shape)
    raise Rejection(
        "bad_shape",
        f"x has shape {list(x.shape)}; expected {expected} or [N, {', '.join(map(str, expected))}]",
    )
