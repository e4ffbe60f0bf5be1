"""The payload formats publishers write and the server reads: one registry (``FORMATS``), one
``WireFormat`` entry per format, read by the decoders (``codec``, ``labels``), the publishers
(``livefit.clients``) and the HTTP labels route alike, so adding a format is one entry.

A message is a map in one of these formats (README "MQTT payloads"). The server takes a
payload's format from its content type when it names one a format accepts, else from its first
byte after ASCII whitespace. In a binary format any array may be a raw little-endian buffer
``{"dtype": "<f4", "shape": [...], "data": <bytes>}`` instead of nested lists (``raw_buffer``);
``RAW_DTYPES`` are the dtypes a server accepts in one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from .rejection import Rejection

RAW_DTYPES = frozenset({"<f2", "<f4", "<f8", "<i1", "<i2", "<i4", "<i8", "|u1", "<u1", "|i1"})


@dataclass(frozen=True, slots=True)
class WireFormat:
    """One payload format: its name, the content types that label it, the first bytes that
    give away an unlabelled payload, and how a document is read and written."""

    name: str  # what publishers are told (``fmt=``, ``--format``)
    content_type: str  # the MQTT 5 content type a publisher sets
    accepted_types: tuple[str, ...]  # content types read as this format (lower case)
    lead_bytes: frozenset[int]  # an unlabelled payload starting so is this format
    describes: str  # what a message in it is, for an error: "a JSON object"
    decode: Callable[[bytes], Any]  # raises on an invalid payload, whatever the exception
    encode: Callable[[Any], bytes]
    binary: bool  # has a bytes type, so it can carry raw buffers


def _json_encode(document: Any) -> bytes:
    return json.dumps(document, allow_nan=False, separators=(",", ":")).encode()


def _msgpack_decode(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def _msgpack_encode(document: Any) -> bytes:
    return msgpack.packb(document, use_bin_type=True)


JSON = WireFormat(
    name="json",
    content_type="application/json",
    accepted_types=("application/json", "text/json"),
    lead_bytes=frozenset(b"{["),
    describes="a JSON object",
    decode=json.loads,
    encode=_json_encode,
    binary=False,
)
MSGPACK = WireFormat(
    name="msgpack",
    content_type="application/msgpack",
    accepted_types=("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"),
    lead_bytes=frozenset([*range(0x80, 0x90), 0xDE, 0xDF]),  # fixmap, map 16, map 32
    describes="a msgpack map",
    decode=_msgpack_decode,
    encode=_msgpack_encode,
    binary=True,
)
FORMATS: dict[str, WireFormat] = {f.name: f for f in (JSON, MSGPACK)}


def register(wire_format: WireFormat) -> None:
    """Add ``wire_format`` to ``FORMATS``; ValueError when its name, a content type it accepts
    or a lead byte is already another format's (a payload must say one format only)."""
    for other in FORMATS.values():
        shared_types = set(wire_format.accepted_types) & set(other.accepted_types)
        shared_bytes = wire_format.lead_bytes & other.lead_bytes
        if wire_format.name == other.name or shared_types or shared_bytes:
            raise ValueError(
                f"format {wire_format.name!r} clashes with {other.name!r}: "
                f"name, content types {sorted(shared_types)} or lead bytes "
                f"{sorted(shared_bytes)}"
            )
    FORMATS[wire_format.name] = wire_format


def format_named(name: str, raw: bool = False) -> WireFormat:
    """The format a publisher asked for by ``name``, able to carry raw buffers if ``raw``;
    ValueError naming the choices otherwise."""
    wire_format = FORMATS.get(name)
    if wire_format is None:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {name!r}")
    if raw and not wire_format.binary:
        binary = sorted(f.name for f in FORMATS.values() if f.binary)
        raise ValueError(
            f"raw buffers need a binary format ({', '.join(binary)}); {name} has no bytes type"
        )
    return wire_format


def format_of(payload: bytes, content_type: str | None) -> WireFormat:
    """The format to read ``payload`` in: the one its content type names, else the one its
    first byte after ASCII whitespace gives away; ``Rejection("undecodable")`` if none."""
    if content_type:
        lowered = content_type.split(";")[0].strip().lower()
        for wire_format in FORMATS.values():
            if lowered in wire_format.accepted_types:
                return wire_format
    head = payload.lstrip()[:1]
    if not head:
        raise Rejection("undecodable", "empty payload")
    for wire_format in FORMATS.values():
        if head[0] in wire_format.lead_bytes:
            return wire_format
    described = " nor ".join(f.describes for f in FORMATS.values())
    raise Rejection("undecodable", f"payload is neither {described}")


def raw_buffer(array: np.ndarray, dtype: str | None = None) -> dict[str, Any]:
    """``array`` as a raw buffer map: in ``dtype`` if given, else in its own dtype made
    little-endian, or float32 when the server would not accept that one."""
    if dtype is None:
        little = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
        dtype = little.str if little.str in RAW_DTYPES else "<f4"
    data = np.ascontiguousarray(array, dtype=np.dtype(dtype))
    return {"dtype": dtype, "shape": list(data.shape), "data": data.tobytes()}
