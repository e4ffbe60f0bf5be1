"""Row ids: what a prediction request or a label may name a row by.

An id is a string of at most ``MAX_ID_BYTES`` UTF-8 bytes or an integer that fits a signed
64-bit value (msgpack and most languages' JSON carry it exactly). Booleans are not ids. In a
list of ids every id is distinct: two rows named alike could not be told apart when their
labels arrive. ``IdError`` says what is wrong in words a client can act on.
"""

from __future__ import annotations

from typing import Any

MAX_ID_BYTES = 256
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1

RowId = str | int


class IdError(ValueError):
    """An id or list of ids is invalid; the message says which and why."""


def check_id(value: Any, where: str = "id") -> RowId:
    """``value`` if it is a valid id, else ``IdError``."""
    if type(value) is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise IdError(f"{where} is an integer outside the signed 64-bit range")
        return value
    if type(value) is str:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise IdError(
                f"{where} must be valid Unicode text (it holds a lone surrogate)"
            ) from None
        if size > MAX_ID_BYTES:
            raise IdError(f"{where} is {size} bytes long; at most {MAX_ID_BYTES}")
        return value
    raise IdError(f"{where} must be a string or an integer, got {_kind(value)}")


def check_ids(value: Any, rows: int, where: str = "ids") -> list[RowId]:
    """A list of ``rows`` distinct valid ids, else ``IdError``."""
    if not isinstance(value, list):
        raise IdError(f"{where} must be a list with one id per row, got {_kind(value)}")
    if len(value) != rows:
        raise IdError(f"{where} has {len(value)} ids for {rows} rows; give one id per row")
    checked = [check_id(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if len(set(map(key_of, checked))) != len(checked):
        seen: set[str] = set()
        for i, item in enumerate(checked):
            if key_of(item) in seen:
                raise IdError(f"{where}[{i}] repeats an id of the same request; ids must differ")
            seen.add(key_of(item))
    return checked


def key_of(row_id: RowId) -> str:
    """The join key of an id: the integer 7 and the string "7" are different ids."""
    return f"i:{row_id}" if type(row_id) is int else f"s:{row_id}"


def _kind(value: Any) -> str:
    return {bool: "a boolean", type(None): "null", float: "a number", dict: "an object"}.get(
        type(value), type(value).__name__
    )
