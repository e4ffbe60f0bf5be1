"""Prediction endpoints: TensorFlow Serving REST (v1) and the Open Inference Protocol (v2).

Every error is JSON ``{"error": "..."}`` telling the user what to fix: 400 bad input, 404
unknown model, 405 a method other than POST, 408 a body too slow, 413 too many rows or bytes,
429 (with Retry-After) when the model's queue is full, 503 before the model has weights, 504
when the request's deadline passed first. Every answer carries the version of the weights that
computed it (``model_version`` and the ``X-Model-Version`` header).

Numbers from headers and parameters are read by ASCII rules and range-checked (Python's
``int``, ``float`` and ``str.isdigit`` take other scripts' digits and unbounded sizes). An
exception nobody foresaw still answers JSON: a 500, counted under ``code="500"`` and logged
in one line. A client that goes away before its body arrived is counted under ``code="499"``
(nothing is sent) and logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from livefit import __version__
from livefit.server.api import protocols
from livefit.server.api.openapi_docs import (
    BINARY_HEADER_PARAM,
    BYTE_COUNT_PATTERN,
    DEADLINE_HEADER_PARAM,
    DECIMAL_PATTERN,
    OIP_REQUEST,
    OIP_RESPONSE,
    TFSERVING_REQUEST,
    TFSERVING_RESPONSE,
    predict_openapi,
)
from livefit.server.api.protocols import ParsedRequest, RequestError
from livefit.server.inference.batcher import (
    RESERVATION_KEY,
    DeadlineExceeded,
    QueueFull,
    Reservation,
    retry_after,
)
from livefit.server.inference.serving import NotReady, ServedModel
from livefit.server.metrics import Metrics

log = logging.getLogger(__name__)
DEADLINE_HEADER = "x-deadline-ms"
OIP_HEADER_LENGTH = "inference-header-content-length"  # the binary-data extension
MAX_DEADLINE_S = 600.0
UNKNOWN_MODEL = "unknown"  # the model label of requests naming no model this server has
CLIENT_GONE = 499  # counted (as nginx logs it), never sent: the client disconnected mid-body
_BYTE_COUNT = re.compile(BYTE_COUNT_PATTERN)  # used with fullmatch
_DECIMAL = re.compile(DECIMAL_PATTERN)
_MAX_TIMEOUT_US = 2**63 - 1  # the OIP timeout is an int64 (Triton: uint64) of microseconds

Served = Callable[[], Mapping[str, ServedModel]]
Parser = Callable[[bytes, ServedModel, Request], ParsedRequest]
Formatter = Callable[[ParsedRequest, ServedModel, Any, int], dict[str, Any]]
Guard = Callable[[Request], None]


class ApiError(Exception):
    """An error answer: HTTP ``status`` and a message for the user."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    # A message quoting the client's text may hold lone surrogates, which UTF-8 cannot encode.
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": safe}, status_code=status, headers=headers)


class PredictHandlers:
    """What the prediction and model-metadata routes do, over the models ``served()`` returns.

    ``guard(request)`` raises a 401 ApiError when a request is not allowed. Every prediction
    request is counted and timed under its status, whatever happens.
    """

    def __init__(
        self, served: Served, metrics: Metrics, guard: Guard | None, body_timeout_s: float
    ) -> None:
        self.served = served
        self.metrics = metrics
        self.guard = guard
        self.body_timeout_s = body_timeout_s
        self._observed: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(self, name: str, code: int, seconds: float) -> None:
        """Count and time a request; a name that is no model is counted as ``"unknown"``, so
        clients cannot create series at will. The labelled children are looked up once."""
        if name not in self.served():
            name = UNKNOWN_MODEL
        children = self._observed.get((name, code))
        if children is None:
            children = self._observed[(name, code)] = (
                self.metrics.predict_requests.labels(model=name, code=str(code)),
                self.metrics.predict_latency.labels(model=name),
            )
        children[0].inc()
        children[1].observe(seconds)

    def lookup(self, request: Request, name: str) -> ServedModel:
        """The model ``name``, once the guard lets ``request`` through; else 401 or 404."""
        if self.guard is not None:
            self.guard(request)
        model = self.served().get(name)
        if model is None:
            known = ", ".join(sorted(self.served())) or "none"
            raise ApiError(404, f"unknown model {name!r}; this server has: {known}")
        return model

    async def predict(
        self, request: Request, name: str, parse: Parser, fmt: Formatter
    ) -> JSONResponse:
        """Answer one request and count it under its status, whatever happens: an exception
        nobody foresaw is a JSON 500, counted and logged in one line, never a bare
        uvicorn 500 that no metric sees."""
        started = time.perf_counter()
        try:
            response = await self._answer(request, name, parse, fmt)
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
        self, request: Request, name: str, parse: Parser, fmt: Formatter
    ) -> JSONResponse:
        reservation: Reservation | None = request.scope.get(RESERVATION_KEY)
        if reservation is not None:
            reservation.start()  # admitted from its head; the event loop has reached it
        try:
            model = self.lookup(request, name)
            if reservation is None:  # not admitted from its head (server/api/connections.py)
                reservation = _shed_early(model, request)
            limit = model.settings.serve.max_request_bytes
            body = await _read_body(request, limit, self.body_timeout_s)
            parsed = parse(body, model, request)
            timeout_s = _timeout_s(request, parsed, model)
            outputs, version = await _run(model, parsed, timeout_s, reservation)
            if parsed.ids is not None and model.recorder is not None:
                model.recorder.record(parsed.ids, parsed.rows, outputs, version)
            response = JSONResponse(fmt(parsed, model, outputs, version))
            response.headers["X-Model-Version"] = str(version)
        except ApiError as exc:
            response = error_response(exc.status, exc.message, exc.headers)
        except RequestError as exc:
            response = error_response(exc.status, exc.message)
        finally:
            if reservation is not None:
                reservation.release()
        return response

    def about(
        self, name: str, request: Request, answer: Callable[[ServedModel], JSONResponse]
    ) -> JSONResponse:
        """``answer(model)``, or the error (401, 404) that stands in its way."""
        try:
            model = self.lookup(request, name)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        return answer(model)

    async def serve_tf(self, request: Request) -> Response:
        return await self.predict(request, request.path_params["name"], _parse_tf, _format_tf)

    async def serve_v2(self, request: Request) -> Response:
        return await self.predict(request, request.path_params["name"], _parse_v2, _format_v2)


def _parse_tf(body: bytes, model: ServedModel, request: Request) -> ParsedRequest:
    s = model.settings
    return protocols.parse_tfserving(body, s.input_shape, s.serve.max_request_rows)


def _format_tf(
    parsed: ParsedRequest, model: ServedModel, outputs: Any, version: int
) -> dict[str, Any]:
    return protocols.format_tfserving(parsed, outputs, version)


def _parse_v2(body: bytes, model: ServedModel, request: Request) -> ParsedRequest:
    s = model.settings
    header = request.headers.get(OIP_HEADER_LENGTH)
    if header is not None and not _BYTE_COUNT.fullmatch(header):
        raise ApiError(
            400,
            f"{OIP_HEADER_LENGTH} must be a byte count in ASCII digits (the length of the "
            f"JSON part of the body), got {_shown(header)}",
        )
    return protocols.parse_oip(
        body,
        s.input_shape,
        s.serve.max_request_rows,
        header_length=int(header) if header is not None else None,
    )


def _format_v2(
    parsed: ParsedRequest, model: ServedModel, outputs: Any, version: int
) -> dict[str, Any]:
    return protocols.format_oip(parsed, outputs, model.name, version)


async def _post_only(request: Request) -> Response:
    """Any other method on ``:predict``: without this, ``GET /v1/models/m:predict`` matches
    the status route ``/v1/models/{name}`` and answers "unknown model 'm:predict'"."""
    return error_response(
        405, f"method {request.method} not allowed; predictions are POST", {"Allow": "POST"}
    )


def build_predict_router(
    served: Served, metrics: Metrics, guard: Guard | None = None, body_timeout_s: float = 10.0
) -> APIRouter:
    """The v1 and v2 prediction and model-metadata routes over the models ``served()`` returns.

    ``guard(request)`` raises a 401 ApiError when a request is not allowed.
    """
    router = APIRouter()
    handlers = PredictHandlers(served, metrics, guard, body_timeout_s)

    @router.post(
        "/v1/models/{name}:predict",
        openapi_extra=predict_openapi(
            TFSERVING_REQUEST, TFSERVING_RESPONSE, (DEADLINE_HEADER_PARAM,)
        ),
    )
    async def tfserving_predict(name: str, request: Request) -> JSONResponse:
        """TensorFlow Serving REST predict (row ``instances`` or column ``inputs`` format)."""
        return await handlers.predict(request, name, _parse_tf, _format_tf)

    @router.get("/v1/models/{name}")
    async def tfserving_status(name: str, request: Request) -> JSONResponse:
        """TensorFlow Serving model status: the version being served, AVAILABLE once ready."""
        return handlers.about(name, request, _tfserving_status)

    @router.post(
        "/v2/models/{name}/infer",
        openapi_extra=predict_openapi(
            OIP_REQUEST, OIP_RESPONSE, (DEADLINE_HEADER_PARAM, BINARY_HEADER_PARAM)
        ),
    )
    async def oip_infer(name: str, request: Request) -> JSONResponse:
        """Open Inference Protocol v2 inference (KServe v2, Triton)."""
        return await handlers.predict(request, name, _parse_v2, _format_v2)

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

    @router.get("/v2")
    async def oip_server_metadata() -> dict[str, Any]:
        return {"name": "livefit", "version": __version__, "extensions": []}

    # The two prediction routes above document the API (OpenAPI). Requests are served by plain
    # Starlette routes to the same handler, matched first: FastAPI's parameter machinery cost
    # 40-50 us a request (measured through the ASGI app), on the event loop that is the
    # bottleneck under load.
    tf_path, v2_path = "/v1/models/{name}:predict", "/v2/models/{name}/infer"
    router.routes[:0] = [
        Route(tf_path, handlers.serve_tf, methods=["POST"], include_in_schema=False),
        Route(tf_path, _post_only, include_in_schema=False),
        Route(v2_path, handlers.serve_v2, methods=["POST"], include_in_schema=False),
    ]
    return router


async def _run(
    model: ServedModel, parsed: ParsedRequest, timeout_s: float, reservation: Reservation | None
) -> tuple[Any, int]:
    if not model.ready() or model.batcher is None:
        raise ApiError(503, f"model {model.name} is not ready yet (no weights); retry shortly",
                       {"Retry-After": "1"})  # fmt: skip
    try:
        prediction = await model.batcher.submit(parsed.rows, timeout_s, reservation)
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


class EarlyAdmission:
    """Refuses a prediction request from its head alone, at the HTTP protocol level
    (``server/api/connections.py`` calls it once a request head has arrived), before any ASGI,
    routing or body work.

    Under overload most requests are refused; through the ASGI stack a refusal cost about as
    much event-loop time as serving (middleware, routing, a task per request), so at three
    times the capacity the loop could not even keep up with refusing. Here it costs a
    dictionary lookup, the batcher's admission check and one write. Only the plain case is
    taken: a POST to a known model's ``:predict`` or ``/infer`` path, with the bearer token
    when ``http.protect_predictions`` asks for one (else the app answers 401); anything else
    goes to the app, which checks admission again (``_shed_early``) before reading the body.
    The answer and its count (``livefit_predict_requests_total``) are those the app would give;
    these refusals (microseconds each) are not timed in ``livefit_predict_latency_seconds``.
    An admitted request goes straight to its endpoint, without the app's middleware and
    routing (which cost about half of an answered request's event-loop time).
    """

    def __init__(
        self, served: Served, metrics: Metrics, token: bytes | None = None,
        guard: Guard | None = None, body_timeout_s: float = 10.0,
    ) -> None:  # fmt: skip
        self.served = served
        self.metrics = metrics
        self.token = token
        # The same endpoints the app routes to (its own instance), called without the app's
        # middleware and routing: an admitted prediction's ASGI work drops by about half.
        handlers = PredictHandlers(served, metrics, guard, body_timeout_s)
        self._direct = (_endpoint_app(handlers.serve_tf), _endpoint_app(handlers.serve_v2))
        self._counted: dict[str, Any] = {}
        self._answers: dict[tuple[str, str, int], bytes] = {}
        self._models: dict[bytes, ServedModel] = {}

    def __call__(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], scope: dict[str, Any]
    ) -> bytes | ASGIApp | None:
        """The whole 429 response to send; or the ASGI app that serves this admitted
        request, its place held (a ``Reservation`` in ``scope``) until it reaches the queue or
        ends; or None to let the whole app handle the request."""
        if method != b"POST":
            return None
        path = url.partition(b"?")[0]
        if path.startswith(b"/v1/models/") and path.endswith(b":predict"):
            name, direct = path[11:-8], self._direct[0]
        elif path.startswith(b"/v2/models/") and path.endswith(b"/infer"):
            name, direct = path[11:-6], self._direct[1]
        else:
            return None
        model = self._models.get(name)
        if model is None:  # first request for it, or no such model
            model = self.served().get(name.decode("latin-1"))
            if model is not None:
                self._models[name] = model
        batcher = model.batcher if model is not None else None
        if model is None or batcher is None or not model.ready():
            return None
        timeout_s = model.settings.serve.default_deadline_ms / 1000.0
        authorized = self.token is None
        for field, value in headers:
            if field == b"x-deadline-ms":
                text = value.decode("latin-1")
                if not _DECIMAL.fullmatch(text) or not float(text) > 0:
                    return None  # the app answers 400
                timeout_s = min(timeout_s, float(text) / 1000.0)
            elif field == b"authorization" and self.token is not None:
                scheme, _, given = value.partition(b" ")
                authorized = scheme.lower() == b"bearer" and hmac.compare_digest(
                    given.strip(), self.token
                )
        if not authorized:
            return None
        refused = batcher.refusal(1, timeout_s)
        if refused is None:
            scope[RESERVATION_KEY] = batcher.reserve(1)
            scope["path_params"] = {"name": model.name}
            return direct
        reason, wait, _ = refused
        key = (model.name, reason, retry_after(wait))
        answer = self._answers.get(key)
        if answer is None:  # a few per model: made once
            answer = self._answers[key] = _refusal_response(*key)
        counted = self._counted.get(model.name)
        if counted is None:
            counted = self._counted[model.name] = self.metrics.predict_requests.labels(
                model=model.name, code="429"
            )
        counted.inc()  # not timed: livefit_predict_latency_seconds times what the app answers
        return answer


def _endpoint_app(endpoint: Callable[[Request], Awaitable[Response]]) -> ASGIApp:
    """``endpoint`` as a bare ASGI app (it answers every error itself, as JSON)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        response = await endpoint(request)
        await response(scope, receive, send)

    return app


_REFUSAL_TEXT = {
    "wait": "the expected wait is over serve.max_queue_wait_ms",
    "deadline": "it would be answered after its deadline",
    "rows": "its queue holds serve.max_queue_rows rows",
}


def _refusal_response(name: str, reason: str, retry_after_s: int) -> bytes:
    message = f"model {name} is overloaded: {_REFUSAL_TEXT[reason]}; retry later"
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: {retry_after_s}\r\n\r\n"
    ).encode() + body


def _shed_early(model: ServedModel, request: Request) -> Reservation | None:
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
    if header is not None and _DECIMAL.fullmatch(header) and float(header) > 0:
        timeout_s = min(timeout_s, float(header) / 1000.0)  # invalid ones get their 400 later
    try:
        batcher.admit(1, timeout_s)
    except QueueFull as exc:
        raise ApiError(429, str(exc), {"Retry-After": str(exc.retry_after_s)}) from None
    return batcher.reserve(1, started=True)


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused with 413 past ``limit`` bytes and 408 when it trickles in too slowly."""
    declared = request.headers.get("content-length")
    if declared is not None and _BYTE_COUNT.fullmatch(declared) and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds max_request_bytes={limit}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"request body exceeds max_request_bytes={limit}")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout_s:g} s") from None
    except ClientDisconnect:
        log.debug("client disconnected after %d bytes of the body of %s", size, request.url.path)
        raise ApiError(CLIENT_GONE, "client disconnected before the body arrived") from None
    return b"".join(chunks)


def _timeout_s(request: Request, parsed: ParsedRequest, model: ServedModel) -> float:
    """The request's deadline: the model default, shortened by X-Deadline-Ms or OIP ``timeout``.

    Like Triton, a request may only shorten the configured default, never lengthen it.
    """
    default = model.settings.serve.default_deadline_ms / 1000.0
    requested: float | None = None
    header = request.headers.get(DEADLINE_HEADER)
    if header is not None:
        requested = _positive(header, f"{DEADLINE_HEADER} header (milliseconds)") / 1000.0
    timeout_us = (parsed.parameters or {}).get("timeout")
    if timeout_us is not None:
        requested = (
            _positive(timeout_us, "parameters.timeout (microseconds)", _MAX_TIMEOUT_US) / 1e6
        )
    return min(default, requested) if requested is not None else default


def _positive(value: Any, what: str, maximum: float = math.inf) -> float:
    """A positive number up to ``maximum`` (finite) from a JSON number (not a boolean) or a
    decimal string in ASCII digits; anything else is a 400. Never ``float()`` of a huge int
    (OverflowError) or of other scripts' digits (which ``float`` reads)."""
    number: float | None = None
    if type(value) is int:  # compared as an int first: no OverflowError, no rounding
        number = float(value) if 0 < value <= maximum else None
    elif type(value) is float:
        number = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = float(value)
    if number is None or not 0 < number < math.inf or (type(value) is not int and number > maximum):
        bound = "" if maximum == math.inf else f" of at most {maximum}"
        raise ApiError(400, f"{what} must be a positive number{bound}, got {_shown(value)}")
    return number


def _shown(value: Any, limit: int = 60) -> str:
    """``value`` for an error message: its repr (ASCII escapes), cut at ``limit`` characters."""
    text = ascii(value) if not isinstance(value, int) or abs(value) < 10**limit else "a huge int"
    return text if len(text) <= limit else text[:limit] + "..."


def _tfserving_status(model: ServedModel) -> JSONResponse:
    return JSONResponse(protocols.tfserving_model_status(_version(model), model.ready()))


def _readiness(model: ServedModel) -> JSONResponse:
    ready = model.ready()
    return JSONResponse({"name": model.name, "ready": ready}, status_code=200 if ready else 503)


def _metadata(model: ServedModel) -> JSONResponse:
    version = _version(model)
    s = model.settings
    versions = [] if version is None else [str(version)]
    return JSONResponse(
        protocols.oip_model_metadata(model.name, versions, s.input_shape, s.output_shape)
    )


def _config(model: ServedModel) -> JSONResponse:
    s = model.settings
    return JSONResponse(
        protocols.triton_model_config(
            model.name, s.input_shape, s.output_shape, s.serve.max_request_rows
        )
    )


def _version(model: ServedModel) -> int | None:
    latest = model.serving.source()
    return latest.version if latest is not None else None
