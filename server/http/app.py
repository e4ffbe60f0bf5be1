"""The FastAPI app: health, metrics (and, in their own modules, the prediction endpoints).

One lifespan owns every background part: the runtime is started when uvicorn starts the app
and stopped, in order and with timeouts, when uvicorn shuts it down.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from livefit import __version__

from ..base.heartbeat import beating
from ..base.metrics import Metrics
from ..base.metrics_merge import WorkerMetrics
from ..config.settings import Settings
from ..serve.endpoint import ModelEndpoint
from ..weights.store import WeightStore
from .admin_api import AdminGuard, build_admin_router
from .auth import TokenGuard
from .dashboard import build_dashboard_router
from .labels_api import build_labels_router
from .predict_api import build_predict_router
from .predict_request import error_response
from .weights_api import build_weights_router

log = logging.getLogger(__name__)


class Runtime(Protocol):
    """What the app (and ``runtime.http_server``) needs from a process's background parts: a
    learner's, a replica's or a split learner's serving process's. Every member is required;
    a runtime with nothing to say implements the plain answer (no checks, no problems)."""

    metrics: Metrics
    settings: Settings
    role: str  # "learner" or "replica": the dashboard's title
    # A pull of a weight version newer than any kept waits this long for it (``weights_api``);
    # 0 everywhere but a split learner's serving process, fed a moment after the manifest.
    wait_newer_weights_s: float

    def preflight(self) -> None:
        """The cheap checks before the socket is bound and anything starts (may raise)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def ready(self) -> bool: ...

    def problems(self) -> list[str]:
        """Why the process is not ready, one line each (empty when it is)."""

    def endpoints(self) -> Mapping[str, ModelEndpoint]:
        """The models this process answers for, by name."""

    def weight_store(self, name: str) -> WeightStore | None: ...


def create_app(
    runtime: Runtime, group: WorkerMetrics | None = None, heartbeat: Path | None = None
) -> FastAPI:
    """An app serving ``runtime``; starting the app starts the runtime. As one of a group of
    serving processes, ``group`` answers the peers and merges their metrics on ``/metrics``,
    and the event loop touches ``heartbeat`` every second while it serves (the group's
    parent kills a process whose loop stops: ``server/base/heartbeat.py``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(runtime.start)
        # TensorFlow and Keras leave ~340k long-lived objects: without this, each full garbage
        # collection pauses the event loop 180-200 ms (measured: p99 210 -> 45 ms at 64 clients).
        gc.collect()
        gc.freeze()
        for endpoint in runtime.endpoints().values():
            endpoint.start_batching(runtime.metrics)
        log.info("livefit %s serving %s", __version__, ", ".join(runtime.endpoints()))
        async with beating(heartbeat):
            if group is not None:
                group.start()  # also tells the group's parent that this worker serves
            try:
                yield
            finally:
                if group is not None:
                    group.stop()
                for endpoint in runtime.endpoints().values():
                    await endpoint.stop_batching()
                await asyncio.to_thread(runtime.stop)

    app = FastAPI(title="livefit", version=__version__, lifespan=lifespan)
    app.state.runtime = runtime
    install_error_handlers(app)
    http = runtime.settings.http
    guard = TokenGuard(http.token_bytes())
    predict_guard = guard.check if http.protect_predictions else None
    app.include_router(
        build_predict_router(runtime.endpoints, runtime.metrics, predict_guard, http.body_timeout_s)
    )
    # a label trains the model: it needs the token whenever one is set, like the weights
    app.include_router(build_labels_router(runtime.endpoints, guard.check, http.body_timeout_s))
    app.include_router(
        build_weights_router(
            runtime.weight_store, runtime.endpoints, guard.check, runtime.wait_newer_weights_s
        )
    )
    app.include_router(
        build_admin_router(
            runtime.endpoints,
            AdminGuard(http.admin_token_bytes()),
            getattr(runtime, "version_control", None),  # None: a replica (its moves are 409)
        )
    )
    app.include_router(
        build_dashboard_router(
            runtime.metrics,
            lambda: list(runtime.endpoints()),
            runtime.role,
            lambda: _problems(runtime),
            group.exposition if group is not None else None,
        )
    )

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        """The process is up (OIP v2 liveness)."""
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        """200 once every model is warmed up, connected and learning and storage works; else
        503 with the reasons (``problems``)."""
        is_ready = runtime.ready()
        body: dict[str, object] = {"ready": is_ready}
        if not is_ready:
            body["problems"] = _problems(runtime)
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text exposition of this process's registry (of every worker's, each
        labelled ``worker``, in a group)."""
        if group is not None:
            body = await group.exposition()
        else:
            body = generate_latest(runtime.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


def _problems(runtime: Runtime) -> list[str]:
    """Why ``runtime`` is not ready (empty when it is)."""
    return [] if runtime.ready() else list(runtime.problems())


def install_error_handlers(app: FastAPI) -> None:
    """Every error, ours or the framework's, is JSON ``{"error": "..."}`` (never a 422 list)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return error_response(400, f"invalid request: {problems}")
