"""Prediction endpoints: TensorFlow Serving REST (v1) and the Open Inference Protocol (v2),
each also with a kept version in the path (``/versions/{version}``: 404 naming the kept ones).

Every error is JSON ``{"error": "..."}`` telling the user what to fix: 400 bad input, 404
unknown model, 405 a method other than POST, 408 a body too slow, 413 too many rows or bytes,
422 when the model's output for the request is not finite (inputs beyond what it computes in
float32; the request alone fails and nothing is recorded for it), 429 (with Retry-After) when
the model's queue is full, 503 before the model has weights, 504 when the request's deadline
passed first. Every answer carries the version of the weights that
computed it (``model_version`` and the ``X-Model-Version`` header).

Numbers from headers and parameters are read by ASCII rules and range-checked (Python's
``int``, ``float`` and ``str.isdigit`` take other scripts' digits and unbounded sizes). An
exception nobody foresaw still answers JSON: a 500, counted under ``code="500"`` and logged
in one line. A client that goes away before its body arrived is counted under ``code="499"``
(nothing is sent) and logged at DEBUG.

This module owns the routes (``build_predict_router``, one helper per protocol) and the
model-metadata answers; what a request's parts mean is ``predict_request``'s, what the
prediction routes do ``predict_handlers``'s, and the refusal from the request head
``early_admission``'s.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route

from livefit import __version__

from ..base.metrics import Metrics
from ..serve.endpoint import ModelEndpoint
from .model_lookup import Endpoints
from .oip import oip_model_metadata, triton_model_config
from .openapi_docs import (
    BINARY_HEADER_PARAM,
    DEADLINE_HEADER_PARAM,
    OIP_REQUEST,
    OIP_RESPONSE,
    TFSERVING_REQUEST,
    TFSERVING_RESPONSE,
    predict_openapi,
)
from .predict_handlers import PredictHandlers
from .predict_request import Guard, error_response, format_tf, format_v2, parse_tf, parse_v2
from .tfserving import tfserving_model_status

# OIP extensions by Triton's names: binary input tensors (outputs are JSON), the config route.
OIP_EXTENSIONS = ["binary_tensor_data", "model_configuration"]


async def _post_only(request: Request) -> Response:
    """Any other method on ``:predict``: without this, ``GET /v1/models/m:predict`` matches
    the status route ``/v1/models/{name}`` and answers "unknown model 'm:predict'"."""
    return error_response(
        405, f"method {request.method} not allowed; predictions are POST", {"Allow": "POST"}
    )


def build_predict_router(
    endpoints: Endpoints, metrics: Metrics, guard: Guard | None = None, body_timeout_s: float = 10.0
) -> APIRouter:
    """The v1 and v2 prediction and model-metadata routes over the models ``endpoints()`` returns.

    ``guard(request)`` raises a 401 ApiError when a request is not allowed.
    """
    router = APIRouter()
    handlers = PredictHandlers(endpoints, metrics, guard, body_timeout_s)
    _tfserving_routes(router, handlers)
    _oip_routes(router, handlers)
    _direct_routes(router, handlers)
    return router


def _tfserving_routes(router: APIRouter, handlers: PredictHandlers) -> None:
    """TF Serving REST: predict and model status (the documented routes)."""

    @router.post(
        "/v1/models/{name}:predict",
        openapi_extra=predict_openapi(
            TFSERVING_REQUEST, TFSERVING_RESPONSE, (DEADLINE_HEADER_PARAM,)
        ),
    )
    async def tfserving_predict(name: str, request: Request) -> JSONResponse:
        """TensorFlow Serving REST predict (row ``instances`` or column ``inputs`` format)."""
        return await handlers.predict(request, name, parse_tf, format_tf)

    @router.get("/v1/models/{name}")
    async def tfserving_status(name: str, request: Request) -> JSONResponse:
        """TensorFlow Serving model status: the version being served, AVAILABLE once ready,
        then every other kept version (served by number)."""
        return handlers.about(name, request, _tfserving_status)

    @router.post(
        "/v1/models/{name}/versions/{version}:predict",
        openapi_extra=predict_openapi(
            TFSERVING_REQUEST, TFSERVING_RESPONSE, (DEADLINE_HEADER_PARAM,)
        ),
    )
    async def tfserving_predict_version(name: str, version: str, request: Request) -> JSONResponse:
        """TensorFlow Serving REST predict with a kept version (404 naming the kept ones)."""
        return await handlers.predict(request, name, parse_tf, format_tf, version=version)

    @router.get("/v1/models/{name}/versions/{version}")
    async def tfserving_version_status(name: str, version: str, request: Request) -> JSONResponse:
        """TensorFlow Serving status of one version: AVAILABLE while kept, else 404 naming the
        kept versions."""
        return handlers.about_version(name, version, request, _tfserving_version_status)

    @router.post(
        "/v1/models/{name}/labels/{label}:predict",
        openapi_extra=predict_openapi(
            TFSERVING_REQUEST, TFSERVING_RESPONSE, (DEADLINE_HEADER_PARAM,)
        ),
    )
    async def tfserving_predict_label(name: str, label: str, request: Request) -> JSONResponse:
        """TensorFlow Serving REST predict with the version a label names (``latest``: the
        newest); 404 naming the labels for an unknown one."""
        return await handlers.predict(request, name, parse_tf, format_tf, label=label)

    @router.get("/v1/models/{name}/labels/{label}")
    async def tfserving_label_status(name: str, label: str, request: Request) -> JSONResponse:
        """TensorFlow Serving status of the version a label names (one entry)."""
        return handlers.about_label(name, label, request, _tfserving_version_status)

    @router.get("/v1/models/{name}/labels/{label}/metadata")
    async def tfserving_label_metadata(name: str, label: str, request: Request) -> JSONResponse:
        """The model's metadata as the version a label names answers it: its version, the
        kept versions, the tensors (OIP's metadata document)."""
        return handlers.about_label(name, label, request, _labelled_metadata)


def _oip_routes(router: APIRouter, handlers: PredictHandlers) -> None:
    """Open Inference Protocol: infer, model metadata, readiness, Triton's config, server
    metadata (the documented routes)."""

    @router.post(
        "/v2/models/{name}/infer",
        openapi_extra=predict_openapi(
            OIP_REQUEST, OIP_RESPONSE, (DEADLINE_HEADER_PARAM, BINARY_HEADER_PARAM)
        ),
    )
    async def oip_infer(name: str, request: Request) -> JSONResponse:
        """Open Inference Protocol v2 inference (KServe v2, Triton)."""
        return await handlers.predict(request, name, parse_v2, format_v2)

    @router.get("/v2/models/{name}")
    async def oip_metadata(name: str, request: Request) -> JSONResponse:
        """OIP model metadata: versions, input and output tensors."""
        return handlers.about(name, request, _metadata)

    @router.get("/v2/models/{name}/ready")
    async def oip_ready(name: str, request: Request) -> JSONResponse:
        """OIP model readiness: 200 once it holds weights, else 503."""
        return handlers.about(name, request, _readiness)

    @router.get("/v2/models/{name}/config")
    async def triton_config(name: str, request: Request) -> JSONResponse:
        """Triton's model configuration (tritonclient ``get_model_config``)."""
        return handlers.about(name, request, _config)

    _oip_version_routes(router, handlers)

    @router.get("/v2/models")
    async def model_index(request: Request) -> JSONResponse:
        """Every model this server serves, with the version it serves and whether it is ready
        (a livefit extension: OIP defines no listing). A replica following several learners
        lists all of their models here."""
        return handlers.index(request, _index_entry)

    @router.get("/v2")
    async def oip_server_metadata() -> dict[str, Any]:
        """OIP server metadata; the extensions by Triton's names (binary input tensors, the
        model configuration route)."""
        return {"name": "livefit", "version": __version__, "extensions": OIP_EXTENSIONS}


def _oip_version_routes(router: APIRouter, handlers: PredictHandlers) -> None:
    """Open Inference Protocol with a version in the path (tritonclient's ``model_version=``):
    infer, metadata, readiness and config of a kept version; 404 naming the kept ones."""

    @router.post(
        "/v2/models/{name}/versions/{version}/infer",
        openapi_extra=predict_openapi(
            OIP_REQUEST, OIP_RESPONSE, (DEADLINE_HEADER_PARAM, BINARY_HEADER_PARAM)
        ),
    )
    async def oip_infer_version(name: str, version: str, request: Request) -> JSONResponse:
        """Open Inference Protocol v2 inference with a kept version."""
        return await handlers.predict(request, name, parse_v2, format_v2, version=version)

    @router.get("/v2/models/{name}/versions/{version}")
    async def oip_version_metadata(name: str, version: str, request: Request) -> JSONResponse:
        """OIP model metadata, asked of a kept version: the kept versions, the tensors."""
        return handlers.about_version(name, version, request, lambda m, _: _metadata(m))

    @router.get("/v2/models/{name}/versions/{version}/ready")
    async def oip_version_ready(name: str, version: str, request: Request) -> JSONResponse:
        """OIP readiness of a kept version: 200 while it is kept and the model ready."""
        return handlers.about_version(name, version, request, _version_readiness)

    @router.get("/v2/models/{name}/versions/{version}/config")
    async def triton_version_config(name: str, version: str, request: Request) -> JSONResponse:
        """Triton's model configuration, asked of a kept version (every version has it)."""
        return handlers.about_version(name, version, request, lambda m, _: _config(m))


def _direct_routes(router: APIRouter, handlers: PredictHandlers) -> None:
    """The plain Starlette routes that serve the two prediction paths, ahead of the rest."""
    # The two prediction routes above document the API (OpenAPI). Requests are served by plain
    # Starlette routes to the same handler, matched first: FastAPI's parameter machinery cost
    # 40-50 us a request (measured through the ASGI app), on the event loop that is the
    # bottleneck under load.
    tf_path, v2_path = "/v1/models/{name}:predict", "/v2/models/{name}/infer"
    tf_version = "/v1/models/{name}/versions/{version}:predict"
    tf_label = "/v1/models/{name}/labels/{label}:predict"
    v2_version = "/v2/models/{name}/versions/{version}/infer"
    router.routes[:0] = [
        Route(tf_path, handlers.serve_tf, methods=["POST"], include_in_schema=False),
        Route(tf_path, _post_only, include_in_schema=False),
        Route(v2_path, handlers.serve_v2, methods=["POST"], include_in_schema=False),
        Route(tf_version, handlers.serve_tf, methods=["POST"], include_in_schema=False),
        Route(tf_version, _post_only, include_in_schema=False),
        Route(tf_label, handlers.serve_tf, methods=["POST"], include_in_schema=False),
        Route(tf_label, _post_only, include_in_schema=False),
        Route(v2_version, handlers.serve_v2, methods=["POST"], include_in_schema=False),
    ]


def _tfserving_status(model: ModelEndpoint) -> JSONResponse:
    kept = model.versions.versions().all()
    return JSONResponse(tfserving_model_status(_version(model), model.ready(), kept))


def _tfserving_version_status(model: ModelEndpoint, version: int) -> JSONResponse:
    return JSONResponse(tfserving_model_status(version, ready=True))


def _version_readiness(model: ModelEndpoint, version: int) -> JSONResponse:
    ready = model.ready()
    return JSONResponse({"name": model.name, "version": str(version), "ready": ready},
                        status_code=200 if ready else 503)  # fmt: skip


def _index_entry(model: ModelEndpoint) -> dict[str, Any]:
    version = _version(model)
    return {"name": model.name, "version": None if version is None else str(version),
            "ready": model.ready()}  # fmt: skip


def _readiness(model: ModelEndpoint) -> JSONResponse:
    ready = model.ready()
    return JSONResponse({"name": model.name, "ready": ready}, status_code=200 if ready else 503)


def _metadata(model: ModelEndpoint) -> JSONResponse:
    """The metadata with every kept version, newest first (the versions OIP's versioned paths
    take; the one served is the newest)."""
    s = model.settings
    versions = [str(v) for v in model.versions.versions().all()]
    return JSONResponse(oip_model_metadata(model.name, versions, s.input_shape, s.output_shape))


def _config(model: ModelEndpoint) -> JSONResponse:
    s = model.settings
    return JSONResponse(
        triton_model_config(model.name, s.input_shape, s.output_shape, s.serve.max_request_rows)
    )


def _labelled_metadata(model: ModelEndpoint, version: int) -> JSONResponse:
    s = model.settings
    versions = [str(v) for v in model.versions.versions().all()]
    document = oip_model_metadata(model.name, versions, s.input_shape, s.output_shape)
    return JSONResponse({**document, "version": str(version)})


def _version(model: ModelEndpoint) -> int | None:
    """The version the unversioned path serves: the pinned or default-labelled one, where the
    serving record names one that is here, else the newest."""
    try:
        chosen = model.versions.served()
    except LookupError:  # named, not arrived: the unversioned path answers 503 until it does
        chosen = None
    latest = chosen or model.serving.source()
    return latest.version if latest is not None else None
