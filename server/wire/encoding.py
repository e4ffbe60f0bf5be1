"""The MQTT payload encoding that publishers (``livefit.clients``) write and the server
(``livefit.server`` codec, labels) reads: one module both import, so the two sides cannot drift.

A message is a JSON object or a msgpack map (README "MQTT payloads"). In msgpack, any array may
be a raw little-endian buffer ``{"dtype": "<f4", "shape": [...], "data": <bytes>}`` instead of
nested lists; ``RAW_DTYPES`` are the dtypes a server accepts in one.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

Format = Literal["json", "msgpack"]
# The MQTT v5 content type a publisher sets for each format.
CONTENT_TYPES: dict[str, str] = {"json": "application/json", "msgpack": "application/msgpack"}
# Content types a server reads as each format (anything else: sniffed from the first byte).
JSON_TYPES = ("application/json", "text/json")
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
RAW_DTYPES = frozenset({"<f2", "<f4", "<f8", "<i1", "<i2", "<i4", "<i8", "|u1", "<u1", "|i1"})


def raw_buffer(array: np.ndarray, dtype: str | None = None) -> dict[str, Any]:
    """``array`` as a raw msgpack buffer map: in ``dtype`` if given, else in its own dtype made
    little-endian, or float32 when the server would not accept that one."""
    if dtype is None:
        little = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
        dtype = little.str if little.str in RAW_DTYPES else "<f4"
    data = np.ascontiguousarray(array, dtype=np.dtype(dtype))
    return {"dtype": dtype, "shape": list(data.shape), "data": data.tobytes()}
