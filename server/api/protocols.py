"""Request and response codecs for the prediction API: TF Serving REST and Open Inference Protocol.

Pure functions, no I/O. The HTTP layer hands in the raw body and gets back float32 rows shaped
``(N, *input_shape)``, or a ``RequestError`` whose ``status`` (400 or 413) and ``message`` tell the
client what to fix; after inference it hands in the outputs and gets back a dict ready for JSON.

Shapes: ``input_shape`` is one example's shape, without the batch dimension. Every request names
the batch first, with two conveniences:

- a model whose input shape ends in 1 also takes rows with that 1 left out, so the TF Serving
  documentation's ``{"instances": [1.0, 2.0, 5.0]}`` is three rows for input shape [1];
- OIP only: a tensor whose shape equals the input shape (same rank, no batch dimension) is one
  row. Rank tells the two apart, so no shape means two things.

Non-finite predictions come back as JSON ``null``: JSON has no NaN, and strict encoders (such as
Starlette's) refuse it. tritonclient reads ``null`` in FP32 data as NaN.

Booleans are not numbers: ``true`` among numbers is refused like ``[true, false]`` is (numpy would
read it as 1). Only the OIP datatype BOOL takes them, and it takes nothing else, as the spec says.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal

import numpy as np

from livefit.server.labels.ids import IdError, RowId, check_ids

Protocol = Literal["tfserving", "oip"]
TfFormat = Literal["row", "col"]

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
PLATFORM = "livefit-keras"
MAX_RANK = 32  # dimensions of a request's array at most (numpy's own limit is 64)
# Tensor parameters that ask for something these codecs do not do; silently ignoring them would
# hand the client an answer of the wrong kind.
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "classification")
_BINARY_HINT = (
    "; binary tensor data after the JSON needs the Inference-Header-Content-Length header"
)


class RequestError(Exception):
    """A request the server will not run: ``status`` is 400 or 413, ``message`` says what to fix."""

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


# --- TF Serving REST ------------------------------------------------------------------------------


def parse_tfserving(body: bytes, input_shape: Sequence[int], max_rows: int) -> ParsedRequest:
    """Parse a TF Serving ``:predict`` body in row (``instances``) or column (``inputs``) format.

    Either format may name the model's single input (``{"x": ...}``); any one name is accepted
    and echoed in ``input_name``. ``signature_name`` is kept in ``parameters`` and not checked.
    """
    document = _load_object(body)
    parameters = _signature(document)
    if ("instances" in document) == ("inputs" in document):
        raise _bad(
            'the body needs exactly one of "instances" (row format) or "inputs" (column format)'
        )
    if "instances" in document:
        tf_format: TfFormat = "row"
        name, values = _tf_instances(document["instances"], max_rows)
    else:
        tf_format = "col"
        name, values = _tf_columns(document["inputs"], max_rows)
    where = '"instances"' if tf_format == "row" else '"inputs"'
    rows = _tf_rows(values, tuple(input_shape), where)
    return ParsedRequest(
        rows=rows, protocol="tfserving", tf_format=tf_format, input_name=name,
        parameters=parameters, ids=_row_ids(document.get("ids"), len(rows), '"ids"'),
    )  # fmt: skip


def format_tfserving(parsed: ParsedRequest, outputs: np.ndarray, version: int) -> dict[str, Any]:
    """The ``:predict`` response: ``predictions`` for row format, ``outputs`` for column format.

    Each prediction keeps the model's true output shape: with output shape [1] that is a list of
    one number per row (``[[3.5], [4.0]]``), where TF Serving's half_plus_two, whose output is a
    scalar per row, answers ``[3.5, 4.0]``. ``model_version`` is our addition; TF Serving's REST
    response does not say which version answered.
    """
    data = _checked_outputs(parsed, outputs)
    key = "outputs" if parsed.tf_format == "col" else "predictions"
    answer = {key: _json_values(data), "model_version": str(version)}
    if parsed.ids is not None:
        answer["ids"] = parsed.ids
    return answer


def tfserving_model_status(version: int | None, ready: bool) -> dict[str, Any]:
    """``GET /v1/models/{name}``: one version entry, AVAILABLE when ready, else LOADING.

    Before any weights exist (``version`` None) the entry reads version "0".
    """
    state = "AVAILABLE" if ready else "LOADING"
    entry = {
        "version": str(version if version is not None else 0),
        "state": state,
        "status": {"error_code": "OK", "error_message": ""},
    }
    return {"model_version_status": [entry]}


def _signature(document: dict[str, Any]) -> dict[str, Any]:
    if "signature_name" not in document:
        return {}
    name = document["signature_name"]
    if not isinstance(name, str):
        raise _bad('"signature_name" must be a string')
    return {"signature_name": name}


def _tf_instances(instances: Any, max_rows: int) -> tuple[str | None, Any]:
    if not isinstance(instances, list) or not instances:
        raise _bad('"instances" must be a non-empty list, one entry per example')
    _check_rows(len(instances), max_rows)
    if not any(isinstance(instance, dict) for instance in instances):
        return None, instances
    keys = {frozenset(i) if isinstance(i, dict) else None for i in instances}
    if len(keys) != 1 or None in keys:
        raise _bad(
            "every instance must be an object with the same input name, "
            'e.g. {"x": [...]}, or every instance a plain array'
        )
    names = sorted(keys.pop() or ())
    if len(names) != 1:
        raise _bad(f"the model has one input, but each instance names {len(names)}: {names}")
    return names[0], [instance[names[0]] for instance in instances]


def _tf_columns(inputs: Any, max_rows: int) -> tuple[str | None, Any]:
    name = None
    if isinstance(inputs, dict):
        if len(inputs) != 1:
            raise _bad(
                f'the model has one input, but "inputs" names {len(inputs)}: {sorted(inputs)}'
            )
        ((name, inputs),) = inputs.items()
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict):
        raise _bad(
            '"inputs" holds objects; in column format it is an array with the batch first, '
            'or {"<input name>": array} (Open Inference Protocol requests go to the v2 API)'
        )
    if isinstance(inputs, list):
        _check_rows(len(inputs), max_rows)
    return name, inputs


def _tf_rows(values: Any, input_shape: tuple[int, ...], where: str) -> np.ndarray:
    array = _json_array(values, where, f"{where} holds true/false; send numbers")
    if array.dtype.kind == "b":
        raise _bad(f"{where} holds true/false; send numbers")
    array = _to_float32(array, where)
    if array.ndim == 0:
        raise _bad(f"{where} must be a list with one entry per example, not a single number")
    if array.shape[0] == 0:
        raise _bad(f"{where} holds no examples")
    n = _batch_size(array.shape, input_shape)
    if n is None and array.shape == input_shape:
        raise _bad(
            f"{where} has shape {list(array.shape)}: each entry is one example, so send one "
            f"example of shape {list(input_shape)} as a list of one "
            f"(expected {_expected(input_shape)})"
        )
    if n is None:
        raise _bad(
            f"{where} has shape {list(array.shape)}, but each example must have shape "
            f"{list(input_shape)} (expected {_expected(input_shape)})"
        )
    return array.reshape((n, *input_shape))


# --- Open Inference Protocol (KServe v2) ----------------------------------------------------------


def parse_oip(
    body: bytes,
    input_shape: Sequence[int],
    max_rows: int,
    input_name: str = "input",
    *,
    output_name: str = "output",
    header_length: int | None = None,
) -> ParsedRequest:
    """Parse an OIP ``/v2/models/{name}/infer`` body holding the model's one input tensor.

    The tensor must carry the model's input name (``input_name``, as the model metadata and
    config say), as Triton requires; more than one tensor is refused rather than some ignored.
    ``output_name`` lets unknown requested outputs fail before inference. ``header_length`` is
    the Inference-Header-Content-Length header: with it, the bytes after the JSON are the
    binary-data extension's tensor data (what tritonclient sends by default); without it the
    whole body is JSON.
    """
    header, binary = _split_body(body, header_length)
    document = _load_object(header, binary_hint=header_length is None)
    tensor = _single_input(document.get("inputs"), input_name)
    output_names = _requested_outputs(document.get("outputs"), output_name)
    rows = _oip_rows(tensor, tuple(input_shape), max_rows, binary)
    if tensor["name"] != input_name:
        raise _bad(
            f'unknown input {_quoted(tensor["name"])}; the model has one input, "{input_name}"'
        )
    parameters = _parameters(document.get("parameters"), "parameters")
    return ParsedRequest(
        rows=rows,
        protocol="oip",
        input_name=tensor["name"],
        request_id=_request_id(document),
        output_names=output_names,
        parameters=parameters,
        ids=_row_ids(parameters.get("ids"), len(rows), "parameters.ids"),
    )


def format_oip(
    parsed: ParsedRequest,
    outputs: np.ndarray,
    model_name: str,
    version: int,
    output_name: str = "output",
) -> dict[str, Any]:
    """The infer response: one FP32 output tensor with flat JSON ``data``.

    The data is always JSON, even where the request asked for binary output
    (``binary_data_output``); clients such as tritonclient read either. The id echoes the
    request's, or is a fresh one.
    """
    if parsed.output_names:
        _check_output_names(parsed.output_names, output_name)
    data = _checked_outputs(parsed, outputs)
    tensor = {
        "name": output_name,
        "shape": list(data.shape),
        "datatype": "FP32",
        "data": _json_values(data.reshape(-1)),
    }
    request_id = parsed.request_id if parsed.request_id is not None else uuid.uuid4().hex
    answer: dict[str, Any] = {
        "model_name": model_name,
        "model_version": str(version),
        "id": request_id,
        "outputs": [tensor],
    }
    if parsed.ids is not None:
        answer["parameters"] = {"ids": parsed.ids}
    return answer


def oip_model_metadata(
    model_name: str,
    versions: list[str],
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    input_name: str = "input",
    output_name: str = "output",
) -> dict[str, Any]:
    """``GET /v2/models/{name}``: FP32 tensors with a variable batch dimension (-1) first."""
    return {
        "name": model_name,
        "versions": [str(v) for v in versions],
        "platform": PLATFORM,
        "inputs": [_tensor_metadata(input_name, input_shape)],
        "outputs": [_tensor_metadata(output_name, output_shape)],
    }


def triton_model_config(
    model_name: str,
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    max_batch_size: int,
    input_name: str = "input",
    output_name: str = "output",
) -> dict[str, Any]:
    """``GET /v2/models/{name}/config`` as Triton answers it (tritonclient's
    ``get_model_config``): dims without the batch dimension, which ``max_batch_size`` (> 0)
    implies, up to the rows one request may hold."""
    return {
        "name": model_name,
        "platform": PLATFORM,
        "backend": "livefit",
        "max_batch_size": int(max_batch_size),
        "input": [
            {
                "name": input_name,
                "data_type": "TYPE_FP32",
                "format": "FORMAT_NONE",
                "dims": [int(d) for d in input_shape],
            }
        ],
        "output": [
            {"name": output_name, "data_type": "TYPE_FP32", "dims": [int(d) for d in output_shape]}
        ],
    }


def _tensor_metadata(name: str, shape: Sequence[int]) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [-1, *(int(d) for d in shape)]}


def _split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if not 0 <= header_length <= len(body):
        raise _bad(
            f"Inference-Header-Content-Length is {header_length}, "
            f"but the body has {len(body)} bytes"
        )
    return body[:header_length], memoryview(body)[header_length:]


def _request_id(document: dict[str, Any]) -> str | None:
    value = document.get("id")
    if value is not None and not isinstance(value, str):
        raise _bad('"id" must be a string')
    if value is not None and not _encodable(value):  # echoed in the response
        raise _bad('"id" must be valid Unicode text (it holds a lone surrogate)')
    return value


def _row_ids(value: Any, rows: int, where: str) -> list[RowId] | None:
    """Per-row ids (delayed labels): absent, or one distinct valid id per row."""
    if value is None:
        return None
    try:
        return check_ids(value, rows, where)
    except IdError as exc:
        raise _bad(str(exc)) from None


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{where} must be an object")
    return value


def _tensor_parameters(value: Any, where: str) -> dict[str, Any]:
    value = _parameters(value, where)
    for key in _UNSUPPORTED_PARAMETERS:
        if key in value:
            raise _bad(f"{where}.{key} is not supported")
    return value


def _single_input(inputs: Any, input_name: str) -> dict[str, Any]:
    if not isinstance(inputs, list) or not inputs:
        raise _bad('"inputs" must be a non-empty list of tensors')
    if len(inputs) > 1:
        names = [t.get("name") if isinstance(t, dict) else None for t in inputs]
        raise _bad(
            f'the model has one input ("{input_name}"), but the request sends '
            f"{len(inputs)}: {names}; send one tensor"
        )
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise _bad('inputs[0] must be an object with "name", "shape", "datatype" and "data"')
    if not isinstance(tensor.get("name"), str):
        raise _bad(f'inputs[0].name must be a string, e.g. "{input_name}"')
    return tensor


def _requested_outputs(outputs: Any, output_name: str) -> list[str] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise _bad('"outputs" must be a list of objects with a "name"')
    for i, requested in enumerate(outputs):
        _tensor_parameters(requested.get("parameters"), f"outputs[{i}].parameters")
    names = [o["name"] for o in outputs]
    _check_output_names(names, output_name)
    return names or None


def _check_output_names(names: list[str], output_name: str) -> None:
    unknown = sorted(set(names) - {output_name})
    if unknown:
        shown = ", ".join(_quoted(name) for name in unknown)
        raise _bad(f'unknown output {shown}; the model has one output, "{output_name}"')


def _oip_rows(
    tensor: dict[str, Any], input_shape: tuple[int, ...], max_rows: int, binary: memoryview
) -> np.ndarray:
    datatype = _datatype(tensor)
    shape = _shape(tensor)
    n = _oip_batch(shape, input_shape)
    if n == 0:
        raise _bad(f"inputs[0].shape {list(shape)} holds no examples")
    _check_rows(n, max_rows)
    values = _tensor_values(tensor, datatype, shape, binary)
    return _to_float32(values, "inputs[0].data").reshape((n, *input_shape))


def _datatype(tensor: dict[str, Any]) -> str:
    datatype = tensor.get("datatype")
    if datatype not in OIP_DATATYPES:
        shown = "missing" if datatype is None else f"{datatype!r}"
        raise _bad(f"inputs[0].datatype is {shown}; use one of {', '.join(OIP_DATATYPES)}")
    return datatype


def _shape(tensor: dict[str, Any]) -> tuple[int, ...]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _bad("inputs[0].shape must be a list of non-negative integers, e.g. [N, ...]")
    if len(shape) > MAX_RANK:
        raise _bad(f"inputs[0].shape has {len(shape)} dimensions; at most {MAX_RANK}")
    return tuple(shape)


def _oip_batch(shape: tuple[int, ...], input_shape: tuple[int, ...]) -> int:
    n = _batch_size(shape, input_shape)
    if n is None and shape == input_shape:
        n = 1
    if n is None:
        raise _bad(
            f"inputs[0].shape {list(shape)} does not match the model's input shape "
            f"{list(input_shape)} (expected {_expected(input_shape)})"
        )
    return n


def _tensor_values(
    tensor: dict[str, Any], datatype: str, shape: tuple[int, ...], binary: memoryview
) -> np.ndarray:
    parameters = _tensor_parameters(tensor.get("parameters"), "inputs[0].parameters")
    count = math.prod(shape)
    if "binary_data_size" in parameters:
        if "data" in tensor:
            raise _bad('inputs[0] has both "data" and parameters.binary_data_size; send one')
        return _binary_values(binary, parameters["binary_data_size"], datatype, count)
    if len(binary):
        raise _bad(
            f"the body has {len(binary)} bytes after the JSON header, but inputs[0] "
            "does not declare parameters.binary_data_size"
        )
    if "data" not in tensor:
        raise _bad("inputs[0].data is missing")
    return _typed_values(tensor["data"], datatype, shape, count)


def _binary_values(binary: memoryview, size: Any, datatype: str, count: int) -> np.ndarray:
    dtype = OIP_DATATYPES[datatype]
    expected = count * dtype.itemsize
    if isinstance(size, bool) or not isinstance(size, int) or size != expected:
        raise _bad(
            f"inputs[0].parameters.binary_data_size is {size!r}, but {count} {datatype} "
            f"values take {expected} bytes"
        )
    if len(binary) != size:
        raise _bad(
            f"inputs[0] declares {size} bytes of binary data, but the body has "
            f"{len(binary)} after the JSON header{_BINARY_HINT if not len(binary) else ''}"
        )
    if datatype == "BOOL":  # any non-zero byte is true; do not trust numpy with other bytes
        return np.frombuffer(binary, dtype=np.uint8) != 0
    return np.frombuffer(binary, dtype=dtype)


def _typed_values(data: Any, datatype: str, shape: tuple[int, ...], count: int) -> np.ndarray:
    """JSON data as the declared datatype, refusing values that datatype cannot hold."""
    array = _json_array(data, "inputs[0].data", _kind_message(datatype))
    if array.size != count:
        raise _bad(f"inputs[0].data has {array.size} values, but shape {list(shape)} needs {count}")
    dtype = OIP_DATATYPES[datatype]
    _check_kind(array, dtype, datatype)  # numpy's own casts would truncate and wrap silently
    try:
        with np.errstate(over="raise", invalid="raise"):
            return array.astype(dtype, copy=False)
    except FloatingPointError:
        raise _bad(f"inputs[0].data holds values out of range for {datatype}") from None


_WANTED = {"b": "true or false", "u": "integers", "i": "integers", "f": "numbers"}
_KIND_MESSAGE = "inputs[0].data must hold {wanted} for datatype {datatype}"


def _kind_message(datatype: str) -> str:
    return _KIND_MESSAGE.format(wanted=_WANTED[OIP_DATATYPES[datatype].kind], datatype=datatype)


def _check_kind(array: np.ndarray, dtype: np.dtype, datatype: str) -> None:
    allowed = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}[dtype.kind]
    if array.dtype.kind not in allowed:
        raise _bad(_kind_message(datatype))
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise _bad(f"inputs[0].data holds values out of range for {datatype}")


# --- shared ---------------------------------------------------------------------------------------


def _bad(message: str) -> RequestError:
    return RequestError(400, message)


def _check_rows(n: int, max_rows: int) -> None:
    if n > max_rows:
        raise RequestError(413, f"{n} examples in one request; at most {max_rows} are allowed")


def _load_object(body: bytes, binary_hint: bool = False) -> dict[str, Any]:
    """The body's JSON object. NaN and Infinity tokens parse (TF Serving's JSON allows them);
    the values are refused later, with a message about the values."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise _bad("the JSON body is nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        extra = isinstance(exc, UnicodeDecodeError) or exc.msg == "Extra data"
        hint = _BINARY_HINT if binary_hint and extra else ""
        raise _bad(f"the body is not valid JSON ({exc}){hint}") from None
    except ValueError as exc:  # Python's limit on the digits of an integer read from text
        reason = str(exc).split(";")[0]
        raise _bad(f"the body holds a number too long to read ({reason}); send numbers") from None
    if not isinstance(document, dict):
        raise _bad(f"the body must be a JSON object, not {_json_type(document)}")
    return document


def _json_array(value: Any, where: str, mixed_bools: str) -> np.ndarray:
    """An array of the JSON values in ``value`` (any numeric or bool dtype); 400 otherwise.

    Booleans among numbers (which numpy reads as 0 and 1) are refused with ``mixed_bools``;
    an array of booleans only comes back as such, for the caller to take or refuse."""
    leaves = _leaf_types(value, where)
    if bool in leaves and leaves & {int, float}:
        raise _bad(mixed_bools)
    try:
        array = np.asarray(value)
    except ValueError:
        raise _bad(f"{where} is ragged: every example must have the same shape") from None
    except RecursionError:
        raise _bad(f"{where} is nested too deeply") from None
    if array.dtype.kind in "US":
        raise _bad(f"{where} holds strings; send numbers")
    if array.dtype.kind not in "biuf":
        raise _bad(f"{where} holds null, objects or integers too large; send numbers")
    return array


def _leaf_types(value: Any, where: str) -> set[type]:
    """The types of the values under the lists of ``value``, at most MAX_RANK deep. One depth
    at a time, without recursion: a few C-level passes whatever the nesting."""
    level, types, depth = [value], {type(value)}, 0
    while list in types:
        if depth == MAX_RANK:
            raise _bad(f"{where} is nested more than {MAX_RANK} lists deep")
        level = list(chain.from_iterable(v for v in level if type(v) is list))
        types = (types - {list}) | set(map(type, level))
        depth += 1
    return types


def _to_float32(array: np.ndarray, where: str) -> np.ndarray:
    """Finite float32 values for the model, from any numeric or bool array."""
    try:
        with np.errstate(over="raise", invalid="raise"):
            rows = array.astype(np.float32, copy=False)
    except FloatingPointError:
        raise _bad(f"{where} holds numbers too large for float32") from None
    if not np.isfinite(rows).all():
        raise _bad(f"{where} holds NaN or infinity; send finite numbers")
    return rows


def _batch_size(shape: tuple[int, ...], input_shape: tuple[int, ...]) -> int | None:
    """N where ``shape`` is [N, *input_shape], or [N, *input_shape[:-1]] if that ends in 1."""
    if len(shape) == len(input_shape) + 1 and shape[1:] == input_shape:
        return shape[0]
    ends_in_one = bool(input_shape) and input_shape[-1] == 1
    if ends_in_one and len(shape) == len(input_shape) and shape[1:] == input_shape[:-1]:
        return shape[0]
    return None


def _expected(input_shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(["N", *(str(d) for d in input_shape)]) + "]"


def _checked_outputs(parsed: ParsedRequest, outputs: np.ndarray) -> np.ndarray:
    """Outputs as float32 with one row per request row; a mismatch is a server bug, not a 400."""
    with np.errstate(over="ignore"):  # overflow gives infinity, which _json_values nulls
        data = np.asarray(outputs, dtype=np.float32)
    n = len(parsed.rows)
    if data.ndim == 0 or data.shape[0] != n:
        got = "a scalar" if data.ndim == 0 else f"{data.shape[0]} rows"
        raise ValueError(f"the model returned {got} of outputs for {n} input rows")
    return data


def _json_values(data: np.ndarray) -> list[Any]:
    """Nested lists of floats, with null for NaN and infinity (JSON has neither)."""
    if np.isfinite(data).all():
        return data.tolist()
    values = data.astype(object)
    values[~np.isfinite(data)] = None
    return values.tolist()


def _encodable(text: str) -> bool:
    """Whether ``text`` can go into a UTF-8 response (JSON escapes may make lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _quoted(text: str, limit: int = 80) -> str:
    """``text`` for an error message: JSON-quoted, ASCII only, cut at ``limit`` characters."""
    shown = json.dumps(text[:limit])
    return shown if len(text) <= limit else shown[:-1] + '..."'


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
