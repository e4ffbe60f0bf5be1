"""The Open Inference Protocol (KServe v2): parse an ``/infer`` body holding the model's one
input tensor (JSON data or the binary-data extension), format the infer response, and the model
metadata and Triton-style config answers. Pure functions, no I/O; the tensor's data is decoded
by ``oip_tensors``, the parts both protocols share are ``protocol_common``'s.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from .oip_tensors import BINARY_HINT, optional_object, tensor_parameters, tensor_rows
from .protocol_common import (
    ParsedRequest,
    bad_request,
    checked_outputs,
    json_values,
    load_object,
    row_ids,
)

PLATFORM = "livefit-keras"


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
    document = load_object(header, BINARY_HINT if header_length is None else "")
    tensor = _single_input(document.get("inputs"), input_name)
    output_names = _requested_outputs(document.get("outputs"), output_name)
    rows = tensor_rows(tensor, tuple(input_shape), max_rows, binary)
    if tensor["name"] != input_name:
        raise bad_request(
            f'unknown input {_quoted(tensor["name"])}; the model has one input, "{input_name}"'
        )
    parameters = optional_object(document.get("parameters"), "parameters")
    return ParsedRequest(
        rows=rows,
        protocol="oip",
        input_name=tensor["name"],
        request_id=_request_id(document),
        output_names=output_names,
        parameters=parameters,
        ids=row_ids(parameters.get("ids"), len(rows), "parameters.ids"),
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
    data = checked_outputs(parsed, outputs)
    tensor = {
        "name": output_name,
        "shape": list(data.shape),
        "datatype": "FP32",
        "data": json_values(data.reshape(-1)),
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
        raise bad_request(
            f"Inference-Header-Content-Length is {header_length}, "
            f"but the body has {len(body)} bytes"
        )
    return body[:header_length], memoryview(body)[header_length:]


def _request_id(document: dict[str, Any]) -> str | None:
    value = document.get("id")
    if value is not None and not isinstance(value, str):
        raise bad_request('"id" must be a string')
    if value is not None and not _encodable(value):  # echoed in the response
        raise bad_request('"id" must be valid Unicode text (it holds a lone surrogate)')
    return value


def _single_input(inputs: Any, input_name: str) -> dict[str, Any]:
    if not isinstance(inputs, list) or not inputs:
        raise bad_request('"inputs" must be a non-empty list of tensors')
    if len(inputs) > 1:
        names = [t.get("name") if isinstance(t, dict) else None for t in inputs]
        raise bad_request(
            f'the model has one input ("{input_name}"), but the request sends '
            f"{len(inputs)}: {names}; send one tensor"
        )
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise bad_request('inputs[0] must be an object with "name", "shape", "datatype" and "data"')
    if not isinstance(tensor.get("name"), str):
        raise bad_request(f'inputs[0].name must be a string, e.g. "{input_name}"')
    return tensor


def _requested_outputs(outputs: Any, output_name: str) -> list[str] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise bad_request('"outputs" must be a list of objects with a "name"')
    for i, requested in enumerate(outputs):
        tensor_parameters(requested.get("parameters"), f"outputs[{i}].parameters")
    names = [o["name"] for o in outputs]
    _check_output_names(names, output_name)
    return names or None


def _check_output_names(names: list[str], output_name: str) -> None:
    unknown = sorted(set(names) - {output_name})
    if unknown:
        shown = ", ".join(_quoted(name) for name in unknown)
        raise bad_request(f'unknown output {shown}; the model has one output, "{output_name}"')


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
