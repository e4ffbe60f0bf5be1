"""An OIP input tensor's data as an array (``tensor_rows``): its datatype (``OIP_DATATYPES``),
shape and batch size, its values from JSON ``data`` or binary data after the JSON header,
checked against the datatype (no silent truncation or wrapping), then as finite float32 rows.
Also the tensor parameters it refuses (``tensor_parameters``) and the hint for binary data
sent without its header (``BINARY_HINT``). Pure functions, no I/O; ``oip`` reads the rest of
the request.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .protocol_common import (
    MAX_RANK,
    bad_request,
    batch_size,
    check_rows,
    expected_shape,
    json_array,
    to_float32,
)

OIP_DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
BINARY_HINT = "; binary tensor data after the JSON needs the Inference-Header-Content-Length header"
# Tensor parameters that ask for something these codecs do not do; silently ignoring them would
# hand the client an answer of the wrong kind.
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "classification")


def optional_object(value: Any, where: str) -> dict[str, Any]:
    """``value`` as OIP ``parameters`` (at ``where``): {} when absent, else a JSON object."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be an object")
    return value


def tensor_parameters(value: Any, where: str) -> dict[str, Any]:
    """A tensor's ``parameters`` (at ``where``), refusing those asking for what these codecs
    do not do."""
    value = optional_object(value, where)
    for key in _UNSUPPORTED_PARAMETERS:
        if key in value:
            raise bad_request(f"{where}.{key} is not supported")
    return value


def tensor_rows(
    tensor: dict[str, Any], input_shape: tuple[int, ...], max_rows: int, binary: memoryview
) -> np.ndarray:
    """The input ``tensor``'s data (JSON, or ``binary`` after the JSON header) as finite
    float32 rows of ``input_shape``, at most ``max_rows`` of them; 400 or 413 otherwise."""
    datatype = _datatype(tensor)
    shape = _shape(tensor)
    n = _oip_batch(shape, input_shape)
    if n == 0:
        raise bad_request(f"inputs[0].shape {list(shape)} holds no examples")
    check_rows(n, max_rows)
    values = _tensor_values(tensor, datatype, shape, binary)
    return to_float32(values, "inputs[0].data").reshape((n, *input_shape))


def _datatype(tensor: dict[str, Any]) -> str:
    datatype = tensor.get("datatype")
    if datatype not in OIP_DATATYPES:
        shown = "missing" if datatype is None else f"{datatype!r}"
        raise bad_request(f"inputs[0].datatype is {shown}; use one of {', '.join(OIP_DATATYPES)}")
    return datatype


def _shape(tensor: dict[str, Any]) -> tuple[int, ...]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise bad_request("inputs[0].shape must be a list of non-negative integers, e.g. [N, ...]")
    if len(shape) > MAX_RANK:
        raise bad_request(f"inputs[0].shape has {len(shape)} dimensions; at most {MAX_RANK}")
    return tuple(shape)


def _oip_batch(shape: tuple[int, ...], input_shape: tuple[int, ...]) -> int:
    n = batch_size(shape, input_shape)
    if n is None and shape == input_shape:
        n = 1
    if n is None:
        raise bad_request(
            f"inputs[0].shape {list(shape)} does not match the model's input shape "
            f"{list(input_shape)} (expected {expected_shape(input_shape)})"
        )
    return n


def _tensor_values(
    tensor: dict[str, Any], datatype: str, shape: tuple[int, ...], binary: memoryview
) -> np.ndarray:
    parameters = tensor_parameters(tensor.get("parameters"), "inputs[0].parameters")
    count = math.prod(shape)
    if "binary_data_size" in parameters:
        if "data" in tensor:
            raise bad_request('inputs[0] has both "data" and parameters.binary_data_size; send one')
        return _binary_values(binary, parameters["binary_data_size"], datatype, count)
    if len(binary):
        raise bad_request(
            f"the body has {len(binary)} bytes after the JSON header, but inputs[0] "
            "does not declare parameters.binary_data_size"
        )
    if "data" not in tensor:
        raise bad_request("inputs[0].data is missing")
    return _typed_values(tensor["data"], datatype, shape, count)


def _binary_values(binary: memoryview, size: Any, datatype: str, count: int) -> np.ndarray:
    dtype = OIP_DATATYPES[datatype]
    expected = count * dtype.itemsize
    if isinstance(size, bool) or not isinstance(size, int) or size != expected:
        raise bad_request(
            f"inputs[0].parameters.binary_data_size is {size!r}, but {count} {datatype} "
            f"values take {expected} bytes"
        )
    if len(binary) != size:
        raise bad_request(
            f"inputs[0] declares {size} bytes of binary data, but the body has "
            f"{len(binary)} after the JSON header{BINARY_HINT if not len(binary) else ''}"
        )
    if datatype == "BOOL":  # any non-zero byte is true; do not trust numpy with other bytes
        return np.frombuffer(binary, dtype=np.uint8) != 0
    return np.frombuffer(binary, dtype=dtype)


def _typed_values(data: Any, datatype: str, shape: tuple[int, ...], count: int) -> np.ndarray:
    """JSON data as the declared datatype, refusing values that datatype cannot hold."""
    array = json_array(data, "inputs[0].data", _kind_message(datatype))
    if array.size != count:
        raise bad_request(
            f"inputs[0].data has {array.size} values, but shape {list(shape)} needs {count}"
        )
    dtype = OIP_DATATYPES[datatype]
    _check_kind(array, dtype, datatype)  # numpy's own casts would truncate and wrap silently
    try:
        with np.errstate(over="raise", invalid="raise"):
            return array.astype(dtype, copy=False)
    except FloatingPointError:
        raise bad_request(f"inputs[0].data holds values out of range for {datatype}") from None


_WANTED = {"b": "true or false", "u": "integers", "i": "integers", "f": "numbers"}
_KIND_MESSAGE = "inputs[0].data must hold {wanted} for datatype {datatype}"


def _kind_message(datatype: str) -> str:
    return _KIND_MESSAGE.format(wanted=_WANTED[OIP_DATATYPES[datatype].kind], datatype=datatype)


def _check_kind(array: np.ndarray, dtype: np.dtype, datatype: str) -> None:
    allowed = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}[dtype.kind]
    if array.dtype.kind not in allowed:
        raise bad_request(_kind_message(datatype))
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise bad_request(f"inputs[0].data holds values out of range for {datatype}")
