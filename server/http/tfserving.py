"""The TF Serving REST protocol: parse a ``:predict`` body in row or column format, format
its response, and the model status answer. Pure functions, no I/O; the shapes and conveniences
are the ones ``protocol_common`` describes (the shared parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .protocol_common import (
    ParsedRequest,
    TfFormat,
    bad_request,
    batch_size,
    check_rows,
    checked_outputs,
    expected_shape,
    json_array,
    json_values,
    load_object,
    row_ids,
    to_float32,
)


def parse_tfserving(body: bytes, input_shape: Sequence[int], max_rows: int) -> ParsedRequest:
    """Parse a TF Serving ``:predict`` body in row (``instances``) or column (``inputs``) format.

    Either format may name the model's single input (``{"x": ...}``); any one name is accepted
    and echoed in ``input_name``. ``signature_name`` is kept in ``parameters`` and not checked.
    """
    document = load_object(body)
    parameters = _signature(document)
    if ("instances" in document) == ("inputs" in document):
        raise bad_request(
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
        parameters=parameters, ids=row_ids(document.get("ids"), len(rows), '"ids"'),
    )  # fmt: skip


def format_tfserving(parsed: ParsedRequest, outputs: np.ndarray, version: int) -> dict[str, Any]:
    """The ``:predict`` response: ``predictions`` for row format, ``outputs`` for column format.

    Each prediction keeps the model's true output shape: with output shape [1] that is a list of
    one number per row (``[[3.5], [4.0]]``), where TF Serving's half_plus_two, whose output is a
    scalar per row, answers ``[3.5, 4.0]``. ``model_version`` is our addition; TF Serving's REST
    response does not say which version answered.
    """
    data = checked_outputs(parsed, outputs)
    key = "outputs" if parsed.tf_format == "col" else "predictions"
    answer = {key: json_values(data), "model_version": str(version)}
    if parsed.ids is not None:
        answer["ids"] = parsed.ids
    return answer


def tfserving_model_status(
    version: int | None, ready: bool, kept: Sequence[int] = ()
) -> dict[str, Any]:
    """``GET /v1/models/{name}``: the served version's entry first, AVAILABLE when ready, else
    LOADING; then the other ``kept`` versions (served by number: AVAILABLE), as TF Serving lists
    every version it holds. ``GET /v1/models/{name}/versions/{N}``: ``version`` N alone.

    Before any weights exist (``version`` None) the entry reads version "0".
    """
    state = "AVAILABLE" if ready else "LOADING"
    entries = [_status_entry(version if version is not None else 0, state)]
    entries += [_status_entry(v, "AVAILABLE") for v in kept if v != version]
    return {"model_version_status": entries}


def _status_entry(version: int, state: str) -> dict[str, Any]:
    return {
        "version": str(version),
        "state": state,
        "status": {"error_code": "OK", "error_message": ""},
    }


def _signature(document: dict[str, Any]) -> dict[str, Any]:
    if "signature_name" not in document:
        return {}
    name = document["signature_name"]
    if not isinstance(name, str):
        raise bad_request('"signature_name" must be a string')
    return {"signature_name": name}


def _tf_instances(instances: Any, max_rows: int) -> tuple[str | None, Any]:
    if not isinstance(instances, list) or not instances:
        raise bad_request('"instances" must be a non-empty list, one entry per example')
    check_rows(len(instances), max_rows)
    if not any(isinstance(instance, dict) for instance in instances):
        return None, instances
    keys = {frozenset(i) if isinstance(i, dict) else None for i in instances}
    if len(keys) != 1 or None in keys:
        raise bad_request(
            "every instance must be an object with the same input name, "
            'e.g. {"x": [...]}, or every instance a plain array'
        )
    names = sorted(keys.pop() or ())
    if len(names) != 1:
        raise bad_request(f"the model has one input, but each instance names {len(names)}: {names}")
    return names[0], [instance[names[0]] for instance in instances]


def _tf_columns(inputs: Any, max_rows: int) -> tuple[str | None, Any]:
    name = None
    if isinstance(inputs, dict):
        if len(inputs) != 1:
            raise bad_request(
                f'the model has one input, but "inputs" names {len(inputs)}: {sorted(inputs)}'
            )
        ((name, inputs),) = inputs.items()
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict):
        raise bad_request(
            '"inputs" holds objects; in column format it is an array with the batch first, '
            'or {"<input name>": array} (Open Inference Protocol requests go to the v2 API)'
        )
    if isinstance(inputs, list):
        check_rows(len(inputs), max_rows)
    return name, inputs


def _tf_rows(values: Any, input_shape: tuple[int, ...], where: str) -> np.ndarray:
    array = json_array(values, where, f"{where} holds true/false; send numbers")
    if array.dtype.kind == "b":
        raise bad_request(f"{where} holds true/false; send numbers")
    array = to_float32(array, where)
    if array.ndim == 0:
        raise bad_request(f"{where} must be a list with one entry per example, not a single number")
    if array.shape[0] == 0:
        raise bad_request(f"{where} holds no examples")
    n = batch_size(array.shape, input_shape)
    if n is None and array.shape == input_shape:
        raise bad_request(
            f"{where} has shape {list(array.shape)}: each entry is one example, so send one "
            f"example of shape {list(input_shape)} as a list of one "
            f"(expected {expected_shape(input_shape)})"
        )
    if n is None:
        raise bad_request(
            f"{where} has shape {list(array.shape)}, but each example must have shape "
            f"{list(input_shape)} (expected {expected_shape(input_shape)})"
        )
    return array.reshape((n, *input_shape))
