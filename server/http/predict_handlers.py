"""What the prediction and model-metadata routes do (``PredictHandlers``): find the model (and
the kept version a versioned path names), shed a request that cannot be served in time before
its body is read (``_shed_early``), read and parse it, queue it on the model's batcher
(``_run``; pinned to that version), answer, and count and time every request under its status.

This module owns the handlers; the routes that call them are ``predict_api``'s and the early
admission from the request head is ``early_admission``'s, which hands each request it admits
here with its ``Reservation``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..base.metrics import Metrics
from ..serve.admission import QueueFull, Reservation
from ..serve.batch_types import DeadlineExceeded
from ..serve.endpoint import ModelEndpoint
from ..serve.metrics import ServingMetrics
from ..serve.serving import NotReady
from ..wire.snapshot import Snapshot
from .model_lookup import Endpoints, find_model, find_served, kept_version, label_version
from .predict_request import (
    DEADLINE_HEADER,
    ApiError,
    Formatter,
    Guard,
    Parser,
    deadline_s,
    error_response,
    format_tf,
    format_v2,
    parse_tf,
    parse_v2,
    positive_decimal,
    read_body,
)
from .protocol_common import ParsedRequest, RequestError, checked_outputs

log = logging.getLogger(__name__)
UNKNOWN_MODEL = "unknown"  # the model label of requests naming no model this server has


class PredictHandlers:
    """What the prediction and model-metadata routes do, over the models ``endpoints()``
    returns.

    ``guard(request)`` raises a 401 ApiError when a request is not allowed. Every prediction
    request is counted and timed under its status, whatever happens.
    """

    def __init__(
        self, endpoints: Endpoints, metrics: Metrics, guard: Guard | None, body_timeout_s: float
    ) -> None:
        self.endpoints = endpoints
        self.metrics = metrics
        self.guard = guard
        metrics.group(ServingMetrics)
        self.body_timeout_s = body_timeout_s
        self._observed: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(self, name: str, code: int, seconds: float) -> None:
        """Count and time a request; a name that is no model is counted as ``"unknown"``, so
        clients cannot create series at will. The labelled children are looked up once."""
        if name not in self.endpoints():
            name = UNKNOWN_MODEL
        children = self._observed.get((name, code))
        if children is None:
            children = self._observed[(name, code)] = (
                self.metrics.group(ServingMetrics).predict_requests.labels(
                    model=name, code=str(code)
                ),
                self.metrics.group(ServingMetrics).predict_latency.labels(model=name),
            )
        children[0].inc()
        children[1].observe(seconds)

    async def predict(
        self, request: Request, name: str, parse: Parser, fmt: Formatter,
        reservation: Reservation | None = None, version: str | None = None,
        label: str | None = None,
    ) -> JSONResponse:  # fmt: skip
        """Answer one request and count it under its status, whatever happens: an exception
        nobody foresaw is a JSON 500, counted and logged in one line, never a bare
        uvicorn 500 that no metric sees. ``reservation``: the place the request holds since
        it was admitted from its head (``EarlyAdmission``), given back here in any case.
        ``version``: the path's version (``/versions/N``), ``label`` its label
        (``/labels/L``); neither: what the serving record serves (the newest by default)."""
        started = time.perf_counter()
        try:
            response = await self._answer(request, name, parse, fmt, reservation, version, label)
        except Exception as exc:
            log.error(
                "prediction request for model %r failed unexpectedly: %s: %s",
                name[:100], type(exc).__name__, " ".join(str(exc).split())[:300],
            )  # fmt: skip
            response = error_response(
                500, f"internal error ({type(exc).__name__}); the server log has the details"
            )
        self.observe(name, response.status_code, time.perf_counter() - started)
        return response

    async def _answer(
        self, request: Request, name: str, parse: Parser, fmt: Formatter,
        reservation: Reservation | None, version: str | None, label: str | None,
    ) -> JSONResponse:  # fmt: skip
        if reservation is not None:
            reservation.start()  # admitted from its head; the event loop has reached it
        try:
            model = find_model(self.endpoints, name, request, self.guard)
            pinned = await find_served(model, version, label)
            if reservation is None:  # not admitted from its head (server/http/connections.py)
                reservation = _shed_early(model, request)
            limit = model.settings.serve.max_request_bytes
            body = await read_body(request, limit, self.body_timeout_s)
            parsed = parse(body, model, request)
            timeout_s = deadline_s(request, parsed, model)
            outputs, computed = await _run(model, parsed, timeout_s, reservation, pinned)
            outputs = checked_outputs(parsed, outputs)  # a non-finite one: 422, never recorded
            if parsed.ids is not None and model.recorder is not None:
                model.recorder.record(parsed.ids, parsed.rows, outputs, computed)
            response = JSONResponse(fmt(parsed, model, outputs, computed))
            response.headers["X-Model-Version"] = str(computed)
        except ApiError as exc:
            response = error_response(exc.status, exc.message, exc.headers)
        except RequestError as exc:
            response = error_response(exc.status, exc.message)
        finally:
            if reservation is not None:
                reservation.release()
        return response

    def about(
        self, name: str, request: Request, answer: Callable[[ModelEndpoint], JSONResponse]
    ) -> JSONResponse:
        """``answer(model)``, or the error (401, 404) that stands in its way."""
        try:
            model = find_model(self.endpoints, name, request, self.guard)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        return answer(model)

    def about_label(
        self, name: str, label: str, request: Request,
        answer: Callable[[ModelEndpoint, int], JSONResponse],
    ) -> JSONResponse:  # fmt: skip
        """``answer(model, version)`` for the version ``label`` names, or the error (401, 404
        naming the labels, 503 while it has not arrived) that stands in its way."""
        try:
            model = find_model(self.endpoints, name, request, self.guard)
            number = label_version(model, label)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        return answer(model, number)

    def about_version(
        self, name: str, version: str, request: Request,
        answer: Callable[[ModelEndpoint, int], JSONResponse],
    ) -> JSONResponse:  # fmt: skip
        """``answer(model, version)`` for a kept version, or the error (400, 401, 404 naming
        the kept versions) that stands in its way."""
        try:
            model = find_model(self.endpoints, name, request, self.guard)
            number = kept_version(model, version)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        return answer(model, number)

    def index(
        self, request: Request, entry: Callable[[ModelEndpoint], dict[str, Any]]
    ) -> JSONResponse:
        """``{"models": [entry(model), ...]}`` by name, or the 401 the guard answers."""
        try:
            if self.guard is not None:
                self.guard(request)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        models = self.endpoints()
        return JSONResponse({"models": [entry(models[name]) for name in sorted(models)]})

    async def serve_tf(self, request: Request) -> Response:
        """The TF Serving ``:predict`` routes' endpoint (the model, and the version if any,
        named in the path)."""
        params = request.path_params
        return await self.predict(
            request, params["name"], parse_tf, format_tf, version=params.get("version"),
            label=params.get("label"),
        )  # fmt: skip

    async def serve_v2(self, request: Request) -> Response:
        """The OIP ``/infer`` routes' endpoint (the model, and the version if any, named in
        the path)."""
        params = request.path_params
        return await self.predict(
            request, params["name"], parse_v2, format_v2, version=params.get("version")
        )


async def _run(
    model: ModelEndpoint, parsed: ParsedRequest, timeout_s: float, reservation: Reservation | None,
    pinned: Snapshot | None = None,
) -> tuple[Any, int]:  # fmt: skip
    if not model.ready() or model.batcher is None:
        raise ApiError(503, f"model {model.name} is not ready yet (no weights); retry shortly",
                       {"Retry-After": "1"})  # fmt: skip
    try:
        prediction = await model.batcher.submit(parsed.rows, timeout_s, reservation, pinned)
    except QueueFull as exc:
        raise ApiError(429, str(exc), {"Retry-After": str(exc.retry_after_s)}) from None
    except DeadlineExceeded as exc:
        raise ApiError(504, str(exc)) from None
    except NotReady as exc:
        raise ApiError(503, str(exc), {"Retry-After": "1"}) from None
    except Exception as exc:
        log.exception("prediction failed for model %s", model.name)
        raise ApiError(500, f"prediction failed: {type(exc).__name__}: {exc}") from None
    return prediction.outputs, prediction.version


def _shed_early(model: ModelEndpoint, request: Request) -> Reservation | None:
    """429 before reading or parsing the body when even a one-row request could not be
    admitted now (expected wait, deadline from the model default or ``X-Deadline-Ms``, queued
    rows): under overload, refusing must cost far less than serving, or the refused starve the
    accepted. An admitted request holds its place until it is queued, where the batcher checks
    again with the real row count and deadline. (``EarlyAdmission`` does this from the head,
    before this app runs at all, for requests a livefit server takes whole.)"""
    batcher = model.batcher
    if batcher is None:
        return None
    timeout_s = model.settings.serve.default_deadline_ms / 1000.0
    header = request.headers.get(DEADLINE_HEADER)
    deadline_ms = positive_decimal(header) if header is not None else None
    if deadline_ms is not None:  # invalid ones get their 400 later
        timeout_s = min(timeout_s, deadline_ms / 1000.0)
    try:
        batcher.admission.admit(1, timeout_s)
    except QueueFull as exc:
        raise ApiError(429, str(exc), {"Retry-After": str(exc.retry_after_s)}) from None
    return batcher.admission.reserve(1, started=True)
