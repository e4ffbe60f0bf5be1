"""Early admission: a prediction request refused from its head alone, at the HTTP protocol
level, with a prepared 429; an admitted one sent straight to its endpoint
(``EarlyAdmission``, called by ``connections``), as an ``AdmittedRequest`` that carries the
place it holds in its model's queue.

This module owns that fast path; what it serves an admitted request with is
``predict_handlers``'s ``PredictHandlers``, and the refusal decision is the batcher's
``AdmissionControl``'s.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import Request
from starlette.types import Receive, Scope, Send

from ..base.metrics import Metrics
from ..serve.admission import Reservation, retry_after
from ..serve.endpoint import ModelEndpoint
from ..serve.metrics import ServingMetrics
from .model_lookup import Endpoints
from .predict_handlers import PredictHandlers
from .predict_request import (
    Formatter,
    Guard,
    Parser,
    format_tf,
    format_v2,
    parse_tf,
    parse_v2,
    positive_decimal,
)


class AdmittedRequest:
    """The ASGI app that serves one prediction request admitted from its head: the endpoint
    the app would route it to, for model ``name``, with the place it holds in the model's
    queue (``reservation``). The handler gives the place back once the request is queued or
    ends; the connection does too when it closes or its response completes, should the
    handler never have run (``release`` is idempotent)."""

    __slots__ = ("format", "handlers", "name", "parse", "reservation")

    def __init__(
        self, handlers: PredictHandlers, name: str, parse: Parser, fmt: Formatter,
        reservation: Reservation,
    ) -> None:  # fmt: skip
        self.handlers = handlers
        self.name = name
        self.parse = parse
        self.format = fmt
        self.reservation = reservation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        response = await self.handlers.predict(
            request, self.name, self.parse, self.format, self.reservation
        )
        await response(scope, receive, send)


class EarlyAdmission:
    """Refuses a prediction request from its head alone, at the HTTP protocol level
    (``server/http/connections.py`` calls it once a request head has arrived), before any ASGI,
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
        self, endpoints: Endpoints, metrics: Metrics, token: bytes | None = None,
        guard: Guard | None = None, body_timeout_s: float = 10.0,
    ) -> None:  # fmt: skip
        self.endpoints = endpoints
        self.metrics = metrics
        self.token = token
        metrics.group(ServingMetrics)
        # The same endpoints the app routes to (its own instance), called without the app's
        # middleware and routing: an admitted prediction's ASGI work drops by about half.
        self._handlers = PredictHandlers(endpoints, metrics, guard, body_timeout_s)
        self._counted: dict[str, Any] = {}
        self._answers: dict[tuple[str, str, int], bytes] = {}
        self._models: dict[bytes, ModelEndpoint] = {}

    def __call__(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]
    ) -> bytes | AdmittedRequest | None:
        """The whole 429 response to send; or the ASGI app that serves this admitted
        request, its place held (its ``reservation``) until it reaches the queue or ends; or
        None to let the whole app handle the request."""
        if method != b"POST":
            return None
        path = url.partition(b"?")[0]
        parse: Parser
        fmt: Formatter
        if path.startswith(b"/v1/models/") and path.endswith(b":predict"):
            name, parse, fmt = path[11:-8], parse_tf, format_tf
        elif path.startswith(b"/v2/models/") and path.endswith(b"/infer"):
            name, parse, fmt = path[11:-6], parse_v2, format_v2
        else:
            return None
        model = self._models.get(name)
        if model is None:  # first request for it, or no such model
            model = self.endpoints().get(name.decode("latin-1"))
            if model is not None:
                self._models[name] = model
        batcher = model.batcher if model is not None else None
        if model is None or batcher is None or not model.ready():
            return None
        timeout_s = model.settings.serve.default_deadline_ms / 1000.0
        authorized = self.token is None
        for field, value in headers:
            if field == b"x-deadline-ms":
                deadline_ms = positive_decimal(value.decode("latin-1"))
                if deadline_ms is None:
                    return None  # the app answers 400
                timeout_s = min(timeout_s, deadline_ms / 1000.0)
            elif field == b"authorization" and self.token is not None:
                scheme, _, given = value.partition(b" ")
                authorized = scheme.lower() == b"bearer" and hmac.compare_digest(
                    given.strip(), self.token
                )
        if not authorized:
            return None
        admission = batcher.admission
        refused = admission.refusal(1, timeout_s)
        if refused is None:
            return AdmittedRequest(self._handlers, model.name, parse, fmt, admission.reserve(1))
        return self._refusal(model.name, refused)

    def _refusal(self, name: str, refused: tuple[str, float, float]) -> bytes:
        """The prepared 429 for a refusal of ``refused`` (the batcher's reason, wait and
        bound), counted."""
        reason, wait, _ = refused
        key = (name, reason, retry_after(wait))
        answer = self._answers.get(key)
        if answer is None:  # a few per model: made once
            answer = self._answers[key] = _refusal_response(*key)
        counted = self._counted.get(name)
        if counted is None:
            counted = self._counted[name] = self.metrics.group(
                ServingMetrics
            ).predict_requests.labels(model=name, code="429")
        counted.inc()  # not timed: livefit_predict_latency_seconds times what the app answers
        return answer


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
