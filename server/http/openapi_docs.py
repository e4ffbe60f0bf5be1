"""OpenAPI descriptions of the prediction request bodies and error answers.

The routes read raw bodies (to enforce byte limits before parsing and to answer malformed JSON
with 400, not FastAPI's 422), so their schemas are given here by hand: they document the API
for users and let schema-driven fuzzers (schemathesis) generate bodies.
"""

from __future__ import annotations

from typing import Any

from .oip_tensors import OIP_DATATYPES

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "what to fix"}},
}
_ERRORS = {
    "400": "invalid body, shape, datatype or values",
    "401": "missing or wrong bearer token (when the endpoint is protected)",
    "404": "unknown model",
    "408": "the body did not arrive within http.body_timeout_s",
    "413": "more rows or bytes than the model's limits",
    "429": "the model's queue is full; see Retry-After",
    "503": "the model has no weights yet; see Retry-After",
    "504": "the request's deadline passed before it was served",
}
TFSERVING_REQUEST = {
    "type": "object",
    "description": 'Row format {"instances": [...]} or column format {"inputs": ...}',
    "properties": {
        "signature_name": {"type": "string"},
        "instances": {"type": "array", "items": {}},
        "inputs": {},
    },
}
TFSERVING_RESPONSE = {
    "type": "object",
    "properties": {
        "predictions": {"type": "array", "items": {}},
        "outputs": {"type": "array", "items": {}},
        "model_version": {"type": "string"},
    },
}
_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype", "data"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": sorted(OIP_DATATYPES)},
        "parameters": {"type": "object"},
        "data": {"type": "array", "items": {}},
    },
}
OIP_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "properties": {
                "timeout": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 2**63 - 1,
                    "description": "shortens the deadline (microseconds, as Triton)",
                }
            },
        },
        "inputs": {"type": "array", "items": _TENSOR},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}},
            },
        },
    },
}
OIP_RESPONSE = {
    "type": "object",
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "outputs": {"type": "array", "items": _TENSOR},
    },
}


# Numbers in headers, in ASCII digits only (Python's int() and float() read other scripts' digits).
BYTE_COUNT_PATTERN = "[0-9]{1,18}"  # 18 digits fit any int64
# A plain decimal as clients write it ("250", "0.5", "2.5e3", what repr(float) gives).
DECIMAL_PATTERN = r"(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?"
DEADLINE_HEADER_PARAM = {
    "name": "X-Deadline-Ms",
    "in": "header",
    "required": False,
    "description": "shortens the deadline (milliseconds, a positive decimal in ASCII digits)",
    "schema": {"type": "string", "pattern": f"^{DECIMAL_PATTERN}$"},
}
BINARY_HEADER_PARAM = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "description": "binary tensor extension: bytes of JSON before the binary tensor data "
    "(ASCII digits)",
    "schema": {"type": "string", "pattern": f"^{BYTE_COUNT_PATTERN}$"},
}


def predict_openapi(
    request: dict[str, Any], response: dict[str, Any], headers: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    """``openapi_extra`` for a predict route: its JSON body, optional headers and every answer
    it can give."""
    responses: dict[str, Any] = {
        "200": {"description": "predictions", "content": {"application/json": {"schema": response}}}
    }
    for code, description in _ERRORS.items():
        responses[code] = {
            "description": description,
            "content": {"application/json": {"schema": ERROR}},
        }
    return {
        "parameters": list(headers),
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": responses,
    }
