"""Prediction clients for livefit's HTTP API: TF Serving REST or Open Inference Protocol v2.

``PredictClient`` (blocking, ``httpx.Client``) and ``AsyncPredictClient`` (``httpx.AsyncClient``)
differ only in how they send: requests are built and answers parsed by the pure functions of
``predict_calls``, and retries decided by ``predict_retry`` (``Attempts``), which both share.
Callers catch ``PredictError`` and read ``PredictResult``: import both from ``predict_calls``.

Retries: an answer of 429 or 503, or a failure to connect (refused, connect timeout, connection
dropped before an answer), is tried again up to ``max_retries`` times, after the server's
Retry-After (seconds or an HTTP-date) or else an exponential backoff with jitter from 0.05 s,
never longer than ``max_backoff`` seconds. Every other failure, 504 included, raises
``PredictError`` at once with the server's message.

Delayed labels (README "Delayed labels"): ``predict(model, rows, ids=[...])`` names each row
(strings or integers, distinct), and ``label(model, id, y)`` or ``labels(model, ids, ys)``
sends the outcome later, to any server of the model (learner or replica).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Collection
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx
import numpy as np
from numpy.typing import ArrayLike

from .predict_calls import (
    PROTOCOLS,
    HttpCall,
    PredictResult,
    Protocol,
    labels_call,
    model_version_call,
    parse_labels,
    parse_model_version,
    parse_prediction,
    predict_call,
)
from .predict_retry import (
    RETRY_STATUSES,
    Attempts,
    Outcome,
    RetryPolicy,
)

DEADLINE_HEADER = "X-Deadline-Ms"
READY_PATH = "/v2/health/ready"


TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)


class _ClientBase(Generic[TransportT]):
    """Settings shared by both clients; subclasses open the HTTP client and do the I/O.

    ``base_url`` is the server, e.g. ``http://127.0.0.1:8000``; ``protocol`` picks TF Serving REST
    or OIP v2 for predictions and model versions. ``timeout`` (seconds) bounds each attempt;
    ``max_retries`` and ``max_backoff`` (seconds) bound the retries of 429, 503 (or the
    ``retry_statuses`` given) and connection failures. ``deadline_ms`` is sent as X-Deadline-Ms on
    every request (the server only lets it shorten its default). ``headers`` go on every request,
    e.g. ``{"Authorization": "Bearer ..."}``. ``transport`` replaces httpx's (for tests, proxies).
    Raises ValueError for settings that cannot work.
    """

    def __init__(
        self,
        base_url: str,
        protocol: Protocol = "v2",
        timeout: float = 10.0,
        max_retries: int = 5,
        max_backoff: float = 5.0,
        deadline_ms: float | None = None,
        headers: dict[str, str] | None = None,
        transport: TransportT | None = None,
        *,
        retry_statuses: Collection[int] = RETRY_STATUSES,
    ) -> None:
        _check_settings(protocol, timeout, max_retries, max_backoff, deadline_ms)
        self.protocol: Protocol = protocol
        self._policy = RetryPolicy(
            max_retries, max_backoff, frozenset(retry_statuses), random.Random()
        )
        sent_headers = dict(headers or {})
        if deadline_ms is not None:
            sent_headers[DEADLINE_HEADER] = repr(float(deadline_ms))
        options = {"base_url": base_url, "timeout": timeout, "headers": sent_headers}
        self._http = self._open(options, transport)

    def _open(self, options: dict[str, Any], transport: TransportT | None) -> Any:
        """The httpx client, built from ``options`` (its keyword arguments) and ``transport``."""
        raise NotImplementedError

    def _attempts(self) -> Attempts:
        return Attempts(self._policy)


class PredictClient(_ClientBase[httpx.BaseTransport]):
    """Blocking client for one livefit server; a context manager that closes its connections.
    Safe to share between threads, as httpx.Client is."""

    _http: httpx.Client

    def predict(
        self, model: str, rows: ArrayLike, ids: list[str | int] | None = None
    ) -> PredictResult:
        """Predict ``rows`` (N, *input_shape) with ``model``, retrying as the module says;
        ``ids`` (one per row) for delayed labels.

        Raises PredictError once the server refuses or cannot answer, ValueError for bad rows.
        """
        call = predict_call(self.protocol, model, rows, ids)
        return parse_prediction(self.protocol, call, self._send(call))

    def label(self, model: str, id: str | int, y: ArrayLike, w: float | None = None) -> None:
        """The label ``y`` (target-shaped) of the row predicted earlier as ``id``."""
        self.labels(model, [id], np.asarray([y]), None if w is None else [w])

    def labels(
        self, model: str, ids: list[str | int], y: ArrayLike, w: ArrayLike | None = None
    ) -> int:
        """Labels for several rows at once; returns how many the server took."""
        return parse_labels(self._send(labels_call(model, ids, y, w)))

    def model_version(self, model: str) -> int | None:
        """The version of the weights ``model`` serves now; None before its first weights."""
        return parse_model_version(
            self.protocol, self._send(model_version_call(self.protocol, model))
        )

    def ready(self) -> bool:
        """Whether the server answers its readiness check with 200 now; False when it cannot be
        reached. Never retries, so it suits polling."""
        try:
            return self._http.get(READY_PATH).status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        """Close the connections; the client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _open(self, options: dict[str, Any], transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(transport=transport, **options)

    def _send(self, call: HttpCall) -> httpx.Response:
        attempts = self._attempts()
        while not isinstance(step := attempts.after(self._try(call)), httpx.Response):
            time.sleep(step)
        return step

    def _try(self, call: HttpCall) -> Outcome:
        try:
            return self._http.request(
                call.method, call.path, content=call.body, headers=call.headers
            )
        except httpx.TransportError as exc:
            return exc


class AsyncPredictClient(_ClientBase[httpx.AsyncBaseTransport]):
    """asyncio client for one livefit server, the same as PredictClient with ``await``; use
    ``async with`` or ``await close()``."""

    _http: httpx.AsyncClient

    async def predict(
        self, model: str, rows: ArrayLike, ids: list[str | int] | None = None
    ) -> PredictResult:
        """As ``PredictClient.predict``; waits between retries without blocking the loop."""
        call = predict_call(self.protocol, model, rows, ids)
        return parse_prediction(self.protocol, call, await self._send(call))

    async def label(self, model: str, id: str | int, y: ArrayLike, w: float | None = None) -> None:
        """As ``PredictClient.label``."""
        await self.labels(model, [id], np.asarray([y]), None if w is None else [w])

    async def labels(
        self, model: str, ids: list[str | int], y: ArrayLike, w: ArrayLike | None = None
    ) -> int:
        """As ``PredictClient.labels``."""
        return parse_labels(await self._send(labels_call(model, ids, y, w)))

    async def model_version(self, model: str) -> int | None:
        """As ``PredictClient.model_version``."""
        response = await self._send(model_version_call(self.protocol, model))
        return parse_model_version(self.protocol, response)

    async def ready(self) -> bool:
        """As ``PredictClient.ready``."""
        try:
            return (await self._http.get(READY_PATH)).status_code == 200
        except httpx.TransportError:
            return False

    async def close(self) -> None:
        """As ``PredictClient.close``."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _open(
        self, options: dict[str, Any], transport: httpx.AsyncBaseTransport | None
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **options)

    async def _send(self, call: HttpCall) -> httpx.Response:
        attempts = self._attempts()
        while not isinstance(step := attempts.after(await self._try(call)), httpx.Response):
            await asyncio.sleep(step)
        return step

    async def _try(self, call: HttpCall) -> Outcome:
        try:
            return await self._http.request(
                call.method, call.path, content=call.body, headers=call.headers
            )
        except httpx.TransportError as exc:
            return exc


def _check_settings(
    protocol: str, timeout: float, max_retries: int, max_backoff: float, deadline_ms: float | None
) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be 0 or more, got {max_retries!r}")
    if not max_backoff >= 0:
        raise ValueError(f"max_backoff must be 0 or more seconds, got {max_backoff!r}")
    if deadline_ms is not None and not 0 < deadline_ms < math.inf:
        raise ValueError(
            f"deadline_ms must be a positive number of milliseconds, got {deadline_ms!r}"
        )
