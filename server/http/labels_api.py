"""``POST /v1/models/<name>/labels``: labels for clients without MQTT.

The body is a label message exactly as on ``livefit/<name>/labels`` (JSON, or msgpack with
``Content-Type: application/msgpack``). It is validated here first, so a bad label gets a 400
naming the reason (``bad_schema: id must be ...``) instead of a dead letter. A valid one is
published to the labels topic at QoS 1, and the answer, 202 ``{"accepted": <labels>}``, comes
once the broker holds it; the learner then joins it like any label (it may still end as
``unknown_id`` or ``duplicate``: joining happens at the learner, later). Any serving process
takes labels, replicas included. 503 (``Retry-After: 1``) when the broker does not take it in
time; 413 over ``max_message_bytes``. A label trains the model, so with ``http.token`` set it
needs the token (401 otherwise), whether or not ``http.protect_predictions`` guards the
predictions.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from ..labels.recorder import NotPublished, PublishRefused
from ..serve.endpoint import ModelEndpoint
from ..wire.codec import SampleSpec
from ..wire.labels import decode_labels
from ..wire.rejection import Rejection
from .model_lookup import Endpoints, find_model
from .predict_request import ApiError, Guard, error_response

PUBLISH_TIMEOUT_S = 10.0


def build_labels_router(
    endpoints: Endpoints,
    guard: Guard | None = None,
    body_timeout_s: float = 10.0,
) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/models/{name}/labels", status_code=202)
    async def post_labels(name: str, request: Request) -> JSONResponse:
        """Labels for earlier predictions (README "Delayed labels"); 202 once the broker has
        them."""
        try:
            model = find_model(endpoints, name, request, guard)
            return await _accept(model, request, body_timeout_s)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)

    return router


async def _accept(model: ModelEndpoint, request: Request, body_timeout_s: float) -> JSONResponse:
    s = model.settings
    limit = s.max_message_bytes
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes exceeds max_message_bytes={limit}")
    try:
        async with asyncio.timeout(body_timeout_s):
            body = await request.body()
    except TimeoutError:
        raise ApiError(408, f"request body not received within {body_timeout_s:g} s") from None
    except ClientDisconnect:
        raise ApiError(499, "client disconnected before the body arrived") from None
    if len(body) > limit:
        raise ApiError(413, f"body of {len(body)} bytes exceeds max_message_bytes={limit}")
    content_type = request.headers.get("content-type")
    spec = SampleSpec(
        tuple(s.input_shape), tuple(s.resolved_target_shape()), limit, s.max_samples_per_message
    )
    try:
        labels = decode_labels(body, spec, content_type)
    except Rejection as exc:
        raise ApiError(400, str(exc)) from None
    recorder = model.recorder
    if recorder is None:
        raise ApiError(503, "labels cannot be forwarded yet (starting)", {"Retry-After": "1"})
    try:
        await asyncio.to_thread(recorder.publish_label, body, content_type, PUBLISH_TIMEOUT_S)
    except PublishRefused as exc:
        raise ApiError(502, str(exc)) from None
    except NotPublished as exc:
        raise ApiError(503, str(exc), {"Retry-After": "1"}) from None
    return JSONResponse({"accepted": len(labels.ids)}, status_code=202)
