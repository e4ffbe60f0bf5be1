"""OpenAPI descriptions of the prediction request bodies and error answers.

The routes read raw bodies (to enforce byte limits before parsing and to answer malformed JSON
with 400, not FastAPI's 422), so their schemas are given here by hand: they document the API
for users and let schema-driven fuzzers (schemathesis) generate bodies.
"""

from __future__ import annotations

from typing import Any

from livefit.server.protocols import OIP_DATATYPES

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
        "parameters": {"type": "object"},
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


def predict_openapi(request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a predict route: its JSON body and every answer it can give."""
    responses: dict[str, Any] = {
        "200": {"description": "predictions", "content": {"application/json": {"schema": response}}}
    }
    for code, description in _ERRORS.items():
        responses[code] = {
            "description": description,
            "content": {"application/json": {"schema": ERROR}},
        }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": responses,
    }
