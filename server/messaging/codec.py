"""Decode and validate one MQTT sample message against a model's declared shapes.

The payload contract (README "MQTT payloads"): a JSON or msgpack map with ``x`` and ``y``, and
optional ``w``, ``id``, ``ts``, ``source``, ``seq``. A single sample's ``x`` has the model's
input shape; a batch's ``x`` has one more leading dimension. In msgpack any of ``x``, ``y``, ``w``
may be a raw little-endian buffer ``{"dtype": "<f4", "shape": [...], "data": <bytes>}``.

Everything wrong with a message raises ``Rejection`` with a reason from ``REASONS`` (a bounded
set, used as a metric label) and a detail for the dead-letter report. Nothing else escapes:
numbers, ranks, dimensions and sizes are checked before numpy or ``float`` sees them, booleans
are not numbers, and an exception nobody foresaw (a bug) becomes ``Rejection("internal")``
naming it, so a message can never stop or wedge the ingest worker.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from itertools import chain
from typing import Any

import msgpack
import numpy as np

from livefit.server.ingestion.samples import SampleChunk
from livefit.wire import JSON_TYPES, MSGPACK_TYPES, RAW_DTYPES

REASONS = (
    "too_large",  # payload over max_message_bytes
    "undecodable",  # neither valid JSON nor msgpack
    "bad_schema",  # not a map, x or y missing, wrong types for the optional fields
    "bad_shape",  # wrong rank or dimensions, ragged arrays, empty batch
    "non_numeric",  # strings, booleans, objects where numbers belong
    "non_finite",  # NaN or infinity in x or y
    "length_mismatch",  # x, y and w disagree on the number of samples
    "bad_weight",  # negative, non-finite or misshapen sample weights
    "too_many_samples",  # more samples in one message than max_samples_per_message
    "internal",  # an unforeseen exception in the decoder (a bug); the detail names it
)
_MAX_ID_LENGTH = 256
MAX_RANK = 32  # dimensions of any array in a message (numpy's own limit is 64)
MAX_TS = 1e11  # "ts" is epoch seconds: 0 up to the year 5138
MAX_SEQ = 2**63 - 1  # "seq" is a non-negative 64-bit integer
_NUMBER_TYPES = frozenset({int, float})  # exact types: bool is a subclass of int, not a number


class Rejection(Exception):
    """A message that cannot be trained on: ``reason`` is one of REASONS, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
        raise Rejection("internal", f"{type(exc).__name__}: {_short(exc)}") from exc


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
    x = _to_array(document["x"], "x", spec.max_message_bytes)
    y = _to_array(document["y"], "y", spec.max_message_bytes)
    x, batched = _shape_inputs(x, spec)
    n = x.shape[0]
    if n > spec.max_samples:
        raise Rejection("too_many_samples", f"{n} samples exceeds max_samples_per_message")
    y = _shape_targets(y, spec.target_shape, n, batched)
    w = _weights(document.get("w"), n, batched, spec.max_message_bytes)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise Rejection("non_finite", "x and y must be finite (no NaN or infinity)")
    published_at = _optional_number(document, "ts")
    chunk = SampleChunk(x=x, y=y, w=w, published_at=published_at, received_at=time.time())
    return DecodedMessage(
        chunk=chunk,
        id=_optional_str(document, "id"),
        source=_optional_str(document, "source"),
        seq=_optional_int(document, "seq"),
    )


def _parse(payload: bytes, content_type: str | None) -> Any:
    kind = _format_of(payload, content_type)
    try:
        if kind == "json":
            return json.loads(payload)
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except RecursionError:
        raise Rejection("undecodable", f"{kind} nested too deeply") from None
    except Exception as exc:  # json, msgpack and UnicodeDecodeError all land here
        raise Rejection("undecodable", f"invalid {kind}: {_short(exc)}") from None


def _format_of(payload: bytes, content_type: str | None) -> str:
    if content_type:
        lowered = content_type.split(";")[0].strip().lower()
        if lowered in JSON_TYPES:
            return "json"
        if lowered in MSGPACK_TYPES:
            return "msgpack"
    head = payload.lstrip()[:1]
    if head in (b"{", b"["):
        return "json"
    if head and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return "msgpack"
    if not head:
        raise Rejection("undecodable", "empty payload")
    raise Rejection("undecodable", "payload is neither a JSON object nor a msgpack map")


def _to_array(value: Any, name: str, max_bytes: int) -> np.ndarray:
    """A float32 array from nested lists/numbers or a raw msgpack buffer."""
    if isinstance(value, dict):
        return _from_raw(value, name, max_bytes)
    if isinstance(value, bool) or value is None or isinstance(value, str | bytes):
        raise Rejection("non_numeric", f"{name} must be numbers, got {type(value).__name__}")
    _check_numbers(value, name)
    try:
        array = np.asarray(value)
        if array.dtype.kind == "O":  # rectangular, all numbers: integers beyond 64 bits
            array = np.asarray(value, dtype=np.float64)
    except OverflowError:
        raise Rejection("non_finite", f"{name} holds integers too large for float32") from None
    except (ValueError, TypeError):
        raise Rejection("bad_shape", f"{name} is ragged: its rows differ in length") from None
    return _as_float32(array, name)


def _check_numbers(value: Any, name: str) -> None:
    """Nested lists of numbers, at most MAX_RANK deep; booleans are not numbers.

    One depth at a time, without recursion: a few C-level passes over the values whatever
    their nesting (about 3 ms for 80,000 values, next to some 25 ms to parse them)."""
    level, types, depth = [value], {type(value)}, 0
    while types == {list}:
        if depth == MAX_RANK:
            raise Rejection("bad_shape", f"{name} is nested more than {MAX_RANK} lists deep")
        types = set(map(type, chain.from_iterable(level)))
        depth += 1
        if types == {list}:
            level = list(chain.from_iterable(level))
    if types <= _NUMBER_TYPES:
        return
    others = types - _NUMBER_TYPES - {list}
    if bool in others:
        raise Rejection("non_numeric", f"{name} holds true/false; booleans are not numbers")
    if others:
        shown = ", ".join(sorted(t.__name__ for t in others))
        raise Rejection("non_numeric", f"{name} holds {shown} where numbers belong")
    raise Rejection("bad_shape", f"{name} is ragged: lists and numbers at the same depth")


def _as_float32(array: np.ndarray, name: str) -> np.ndarray:
    try:
        with np.errstate(over="raise", invalid="raise"):
            return array.astype(np.float32)
    except (OverflowError, FloatingPointError):
        raise Rejection("non_finite", f"{name} holds numbers too large for float32") from None


def _from_raw(value: dict[str, Any], name: str, max_bytes: int) -> np.ndarray:
    dtype, shape, data = value.get("dtype"), value.get("shape"), value.get("data")
    if not isinstance(dtype, str) or dtype not in RAW_DTYPES:
        raise Rejection("bad_schema", f"{name}.dtype must be one of {sorted(RAW_DTYPES)}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise Rejection("bad_schema", f"{name}.shape must be a list of non-negative ints")
    if len(shape) > MAX_RANK:
        raise Rejection(
            "bad_shape", f"{name}.shape has {len(shape)} dimensions; at most {MAX_RANK}"
        )
    if not isinstance(data, bytes):
        raise Rejection("bad_schema", f"{name}.data must be msgpack bin bytes")
    itemsize = np.dtype(dtype).itemsize
    # Every dimension, even beside a 0, must fit in a message: numpy refuses shapes whose
    # product (zeros aside) overflows, and no message holds a larger array anyway.
    if math.prod(max(d, 1) for d in shape) * itemsize > max_bytes:
        raise Rejection(
            "bad_shape", _short(f"{name}.shape {shape} is larger than a message can hold")
        )
    expected = math.prod(shape) * itemsize
    if len(data) != expected:
        raise Rejection(
            "bad_shape", f"{name}.data has {len(data)} bytes, shape {shape} needs {expected}"
        )
    array = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    return _as_float32(array, name)


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


def _shape_targets(y: np.ndarray, target: tuple[int, ...], n: int, batched: bool) -> np.ndarray:
    wanted = (n, *target)
    if y.shape == wanted and batched:
        return y
    if batched:
        if y.ndim == 0 or y.shape[0] != n:
            got = "a scalar" if y.ndim == 0 else f"{y.shape[0]} targets"
            raise Rejection("length_mismatch", f"x has {n} samples but y has {got}")
    elif y.shape == target:
        return y.reshape(wanted)
    if y.size == math.prod(wanted) and _squeezable(y.shape, wanted, batched):
        return y.reshape(wanted)
    raise Rejection(
        "bad_shape", f"y has shape {list(y.shape)}; expected {list(wanted if batched else target)}"
    )


def _squeezable(shape: tuple[int, ...], wanted: tuple[int, ...], batched: bool) -> bool:
    """Only the unambiguous case: a trailing dimension of 1 added or left out."""
    core = shape[1:] if batched else shape
    target = wanted[1:]
    return core == (*target, 1) or (*core, 1) == target


def _weights(value: Any, n: int, batched: bool, max_bytes: int) -> np.ndarray:
    if value is None:
        return np.ones(n, dtype=np.float32)
    if isinstance(value, bool | str | bytes):
        raise Rejection("bad_weight", "w must be a number or a list of numbers")
    try:
        w = _to_array(value, "w", max_bytes)
    except Rejection as exc:
        raise Rejection("bad_weight", exc.detail) from None
    if w.ndim == 0 and not batched:
        w = w.reshape(1)
    if w.shape != (n,):
        raise Rejection("bad_weight", f"w has shape {list(w.shape)}; expected [{n}]")
    if not np.isfinite(w).all() or (w < 0).any():
        raise Rejection("bad_weight", "w must be finite and non-negative")
    return w


def _optional_number(document: dict[str, Any], key: str) -> float | None:
    value = document.get(key)
    if value is None:
        return None
    # Compared as Python numbers: a 400-digit integer is out of range, not an OverflowError.
    if type(value) not in _NUMBER_TYPES or not 0 <= value <= MAX_TS:
        raise Rejection("bad_schema", f"{key} must be a number of epoch seconds, 0 to {MAX_TS:g}")
    return float(value)


def _optional_int(document: dict[str, Any], key: str) -> int | None:
    value = document.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise Rejection("bad_schema", f"{key} must be an integer from 0 to 2**63-1")
    return value


def _optional_str(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _MAX_ID_LENGTH:
        raise Rejection("bad_schema", f"{key} must be a string of at most {_MAX_ID_LENGTH} chars")
    return value


def _short(exc: BaseException | str, limit: int = 200) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."
