"""What both prediction protocols share: the parsed request (``ParsedRequest``), the error a
client gets (``RequestError``, 400 or 413: ``bad_request``, ``check_rows``; 422 for an output
that is not finite), and the pure helpers that read a JSON body into finite float32 rows
(``load_object``, ``json_array``, ``to_float32``, ``batch_size``, ``row_ids``) and turn
outputs back into JSON (``checked_outputs``, ``json_values``).

Pure functions, no I/O. ``tfserving``, ``oip`` and ``oip_tensors`` build on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal

import numpy as np

from ..wire.label_ids import IdError, RowId, check_ids

Protocol = Literal["tfserving", "oip"]
TfFormat = Literal["row", "col"]
MAX_RANK = 32  # dimensions of a request's array at most (numpy's own limit is 64)


class RequestError(Exception):
    """A request the server will not run or answer: ``status`` is 400 or 413 (or 422: the
    model's output for it is not finite), ``message`` says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True, eq=False)
class ParsedRequest:
    """A valid prediction request: float32 ``rows`` of shape (N, *input_shape), and what the
    response needs to echo (format, names, id, parameters)."""

    rows: np.ndarray
    protocol: Protocol
    tf_format: TfFormat | None = None
    input_name: str | None = None
    request_id: str | None = None
    output_names: list[str] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    ids: list[RowId] | None = None  # one per row, for delayed labels; echoed in the response


def row_ids(value: Any, rows: int, where: str) -> list[RowId] | None:
    """Per-row ids (delayed labels): absent, or one distinct valid id per row."""
    if value is None:
        return None
    try:
        return check_ids(value, rows, where)
    except IdError as exc:
        raise bad_request(str(exc)) from None


def bad_request(message: str) -> RequestError:
    """The 400 a request gets for ``message`` (to raise)."""
    return RequestError(400, message)


def check_rows(n: int, max_rows: int) -> None:
    """413 when a request holds ``n`` examples, more than ``max_rows``."""
    if n > max_rows:
        raise RequestError(413, f"{n} examples in one request; at most {max_rows} are allowed")


def load_object(body: bytes, extra_data_hint: str = "") -> dict[str, Any]:
    """The body's JSON object. NaN and Infinity tokens parse (TF Serving's JSON allows them);
    the values are refused later, with a message about the values. ``extra_data_hint`` ends
    the message when the JSON is followed by more data or is not UTF-8 (for OIP: binary data
    sent without its header)."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise bad_request("the JSON body is nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        extra = isinstance(exc, UnicodeDecodeError) or exc.msg == "Extra data"
        hint = extra_data_hint if extra else ""
        raise bad_request(f"the body is not valid JSON ({exc}){hint}") from None
    except ValueError as exc:  # Python's limit on the digits of an integer read from text
        reason = str(exc).split(";")[0]
        raise bad_request(
            f"the body holds a number too long to read ({reason}); send numbers"
        ) from None
    if not isinstance(document, dict):
        raise bad_request(f"the body must be a JSON object, not {_json_type(document)}")
    return document


def json_array(value: Any, where: str, mixed_bools: str) -> np.ndarray:
    """An array of the JSON values in ``value`` (any numeric or bool dtype); 400 otherwise.

    Booleans among numbers (which numpy reads as 0 and 1) are refused with ``mixed_bools``;
    an array of booleans only comes back as such, for the caller to take or refuse."""
    leaves = _leaf_types(value, where)
    if bool in leaves and leaves & {int, float}:
        raise bad_request(mixed_bools)
    try:
        array = np.asarray(value)
    except ValueError:
        raise bad_request(f"{where} is ragged: every example must have the same shape") from None
    except RecursionError:
        raise bad_request(f"{where} is nested too deeply") from None
    if array.dtype.kind in "US":
        raise bad_request(f"{where} holds strings; send numbers")
    if array.dtype.kind not in "biuf":
        raise bad_request(f"{where} holds null, objects or integers too large; send numbers")
    return array


def _leaf_types(value: Any, where: str) -> set[type]:
    """The types of the values under the lists of ``value``, at most MAX_RANK deep. One depth
    at a time, without recursion: a few C-level passes whatever the nesting."""
    level, types, depth = [value], {type(value)}, 0
    while list in types:
        if depth == MAX_RANK:
            raise bad_request(f"{where} is nested more than {MAX_RANK} lists deep")
        level = list(chain.from_iterable(v for v in level if type(v) is list))
        types = (types - {list}) | set(map(type, level))
        depth += 1
    return types


def to_float32(array: np.ndarray, where: str) -> np.ndarray:
    """Finite float32 values for the model, from any numeric or bool array."""
    try:
        with np.errstate(over="raise", invalid="raise"):
            rows = array.astype(np.float32, copy=False)
    except FloatingPointError:
        raise bad_request(f"{where} holds numbers too large for float32") from None
    if not np.isfinite(rows).all():
        raise bad_request(f"{where} holds NaN or infinity; send finite numbers")
    return rows


def batch_size(shape: tuple[int, ...], input_shape: tuple[int, ...]) -> int | None:
    """N where ``shape`` is [N, *input_shape], or [N, *input_shape[:-1]] if that ends in 1."""
    if len(shape) == len(input_shape) + 1 and shape[1:] == input_shape:
        return shape[0]
    ends_in_one = bool(input_shape) and input_shape[-1] == 1
    if ends_in_one and len(shape) == len(input_shape) and shape[1:] == input_shape[:-1]:
        return shape[0]
    return None


def expected_shape(input_shape: tuple[int, ...]) -> str:
    """The shape a request's array must have, for an error message: ``[N, 2, 3]``."""
    return "[" + ", ".join(["N", *(str(d) for d in input_shape)]) + "]"


def checked_outputs(parsed: ParsedRequest, outputs: np.ndarray) -> np.ndarray:
    """Outputs as float32 with one row per request row; a mismatch is a server bug, not a 400.

    An output that is not finite (NaN or infinity: inputs this model cannot compute in float32,
    such as values near 3.4e38) is a 422 for this request alone: its client learns why instead
    of reading ``null``, and it is never recorded for delayed labels."""
    with np.errstate(over="ignore"):  # a float64 output beyond float32 becomes infinity: a 422
        data = np.asarray(outputs, dtype=np.float32)
    n = len(parsed.rows)
    if data.ndim == 0 or data.shape[0] != n:
        got = "a scalar" if data.ndim == 0 else f"{data.shape[0]} rows"
        raise ValueError(f"the model returned {got} of outputs for {n} input rows")
    finite = np.isfinite(data.reshape(n, -1)).all(axis=1)
    if not finite.all():
        raise RequestError(422, _not_finite(np.flatnonzero(~finite).tolist(), n))
    return data


def json_values(data: np.ndarray) -> list[Any]:
    """Nested lists of floats (``checked_outputs`` let only finite ones through)."""
    return data.tolist()


def _not_finite(rows: list[int], n: int) -> str:
    shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
    which = f"row {shown}" if len(rows) == 1 else f"rows {shown}"
    return (
        f"the model's output for {which} of {n} is not finite (NaN or infinity): the inputs "
        "are beyond what this model computes in float32 (values near 3.4e+38 overflow); "
        "no prediction was answered or recorded for this request"
    )


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
