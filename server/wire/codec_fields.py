"""The fields of a message, each decoded and checked before numpy or ``float`` sees it: arrays
of numbers (nested lists, or raw msgpack buffers) as float32, targets shaped to a model's target
shape, sample weights, and the optional ``ts``, ``seq`` and string identifiers.

Shared by the sample decoder (``codec``) and the delayed labels' wire format
(``labels.wire``). Everything wrong raises ``Rejection``.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any

import numpy as np

from .formats import RAW_DTYPES
from .rejection import Rejection, short

_MAX_ID_LENGTH = 256
MAX_RANK = 32  # dimensions of any array in a message (numpy's own limit is 64)
MAX_TS = 1e11  # "ts" is epoch seconds: 0 up to the year 5138
MAX_SEQ = 2**63 - 1  # "seq" is a non-negative 64-bit integer
_NUMBER_TYPES = frozenset({int, float})  # exact types: bool is a subclass of int, not a number


def to_array(value: Any, name: str, max_bytes: int) -> np.ndarray:
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
            "bad_shape", short(f"{name}.shape {shape} is larger than a message can hold")
        )
    expected = math.prod(shape) * itemsize
    if len(data) != expected:
        raise Rejection(
            "bad_shape", f"{name}.data has {len(data)} bytes, shape {shape} needs {expected}"
        )
    array = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    return _as_float32(array, name)


def shape_targets(y: np.ndarray, target: tuple[int, ...], n: int, batched: bool) -> np.ndarray:
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


def sample_weights(value: Any, n: int, batched: bool, max_bytes: int) -> np.ndarray:
    if value is None:
        return np.ones(n, dtype=np.float32)
    if isinstance(value, bool | str | bytes):
        raise Rejection("bad_weight", "w must be a number or a list of numbers")
    try:
        w = to_array(value, "w", max_bytes)
    except Rejection as exc:
        raise Rejection("bad_weight", exc.detail) from None
    if w.ndim == 0 and not batched:
        w = w.reshape(1)
    if w.shape != (n,):
        raise Rejection("bad_weight", f"w has shape {list(w.shape)}; expected [{n}]")
    if not np.isfinite(w).all() or (w < 0).any():
        raise Rejection("bad_weight", "w must be finite and non-negative")
    return w


def optional_number(document: dict[str, Any], key: str) -> float | None:
    value = document.get(key)
    if value is None:
        return None
    # Compared as Python numbers: a 400-digit integer is out of range, not an OverflowError.
    if type(value) not in _NUMBER_TYPES or not 0 <= value <= MAX_TS:
        raise Rejection("bad_schema", f"{key} must be a number of epoch seconds, 0 to {MAX_TS:g}")
    return float(value)


def optional_int(document: dict[str, Any], key: str) -> int | None:
    value = document.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise Rejection("bad_schema", f"{key} must be an integer from 0 to 2**63-1")
    return value


def optional_str(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _MAX_ID_LENGTH:
        raise Rejection("bad_schema", f"{key} must be a string of at most {_MAX_ID_LENGTH} chars")
    return value
