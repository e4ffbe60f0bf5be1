"""Encode samples into the MQTT payload the server decodes (server/wire/codec.py).

The contract: a map in one of ``formats.FORMATS`` (JSON, msgpack) with ``x`` and ``y`` and
optional ``w``, ``id``, ``ts``, ``source``, ``seq``, ``epoch``. A single sample's ``x`` has the
model's input shape; a batch adds a leading dimension of N, with ``y`` N targets and ``w`` N
weights. In a binary format (msgpack) and with ``raw=True`` each of ``x``, ``y`` and a batch's
``w`` is a little-endian buffer ``{"dtype": "<f4", "shape": [...], "data": <bytes>}`` instead
of nested lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from livefit.server.wire.formats import format_named, raw_buffer


def encode_samples(
    x: np.ndarray,
    y: np.ndarray,
    *,
    fmt: str,
    batched: bool,
    raw: bool = False,
    w: float | np.ndarray | None = None,
    ts: float | None = None,
    source: str | None = None,
    seq: int | None = None,
    id: str | None = None,
    epoch: int | None = None,
) -> bytes:
    """One message holding one sample (``batched=False``) or ``len(x)`` samples.

    ``w`` is a number for a single sample; for a batch, a number (given to every sample) or N
    numbers. Raises ValueError for an unknown ``fmt`` (or ``raw`` in a format without bytes),
    non-finite values or disagreeing sample counts, and TypeError for non-numeric arrays, so
    that a message the server would reject is never sent.
    """
    wire_format = format_named(fmt, raw)
    x_array, y_array = _numeric(x, "x"), _numeric(y, "y")
    weights = _weights(w, x_array, y_array, batched)
    encode = raw_buffer if raw else _nested
    document: dict[str, Any] = {"x": encode(x_array), "y": encode(y_array)}
    if weights is not None:
        document["w"] = encode(weights) if batched else float(weights)
    optional = {"id": id, "ts": ts, "source": source, "seq": seq, "epoch": epoch}
    document.update({key: value for key, value in optional.items() if value is not None})
    return wire_format.encode(document)


def _numeric(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold numbers, got dtype {array.dtype}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError(f"{name} holds NaN or infinity; the server rejects non-finite values")
    return array


def _weights(
    w: float | np.ndarray | None, x: np.ndarray, y: np.ndarray, batched: bool
) -> np.ndarray | None:
    if batched and (x.ndim == 0 or y.ndim == 0 or len(x) != len(y)):
        raise ValueError(
            "a batch needs x and y with the same leading length, got shapes "
            f"{list(x.shape)} and {list(y.shape)}"
        )
    if w is None:
        return None
    weights = _numeric(w, "w").astype(np.float32)
    if batched and weights.ndim == 0:
        weights = np.full(len(x), weights, dtype=np.float32)
    expected: tuple[int, ...] = (len(x),) if batched else ()
    if weights.shape != expected:
        raise ValueError(f"w has shape {list(weights.shape)}; expected {list(expected)}")
    if (weights < 0).any():
        raise ValueError("w must be non-negative")
    return weights


def _nested(array: np.ndarray) -> Any:
    return array.tolist()
