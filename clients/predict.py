"""Prediction clients for livefit's HTTP API: TF Serving REST or Open Inference Protocol v2.

``PredictClient`` (blocking, ``httpx.Client``) and ``AsyncPredictClient`` (``httpx.AsyncClient``)
differ only in how they send: requests are built, answers parsed and retries decided by the pure
functions and the ``_Attempts`` class below, which both share.

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
import email.utils
import json
import math
import random
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar
from urllib.parse import quote

import httpx
import numpy as np
from numpy.typing import ArrayLike

Protocol = Literal["tfserving", "v2"]
PROTOCOLS: tuple[Protocol, ...] = ("tfserving", "v2")
DEADLINE_HEADER = "X-Deadline-Ms"
VERSION_HEADER = "X-Model-Version"
READY_PATH = "/v2/health/ready"
RETRY_STATUSES = frozenset({429, 503})
FIRST_BACKOFF_S = 0.05
# A connection that failed before the request reached the server: safe to send again.
CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)
_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class PredictResult:
    """One prediction: float32 ``outputs`` of shape (N, *output_shape), one row per input row,
    and the ``version`` of the weights that computed them. NaN stands for the server's null."""

    outputs: np.ndarray
    version: int
    ids: list[str | int] | None = None  # the row ids the server echoed, when sent


class PredictError(Exception):
    """A prediction or status call that failed for good.

    ``status`` is the HTTP status of the last answer, or 0 when no answer came (the server could
    not be reached, or did not answer in ``timeout``). ``message`` is the server's own message
    where it sent one. ``retry_after`` is the last Retry-After in seconds, if any; ``attempts``
    counts the requests sent.
    """

    def __init__(
        self, status: int, message: str, retry_after: float | None = None, attempts: int = 1
    ) -> None:
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.attempts = attempts
        prefix = f"HTTP {status}" if status else "no answer"
        suffix = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{prefix}: {message}{suffix}")


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One request to send: ``method`` and ``path`` (relative to the base URL), an optional JSON
    ``body``, and for predictions the number of ``rows`` the answer must have."""

    method: str
    path: str
    body: bytes | None = None
    rows: int = 0

    @property
    def headers(self) -> Mapping[str, str] | None:
        return _JSON_HEADERS if self.body is not None else None


# --- requests and answers (pure) ------------------------------------------------------------------


def predict_call(
    protocol: Protocol, model: str, rows: ArrayLike, ids: list[str | int] | None = None
) -> HttpCall:
    """The request predicting ``rows`` (N, *input_shape) with ``model``; ``ids``, one per row,
    makes the server record the predictions for delayed labels.

    Raises ValueError for rows that are not a non-empty array of finite float32 numbers, which the
    server would refuse anyway.
    """
    array = _rows(rows)
    name = quote(model, safe="")
    if protocol == "tfserving":
        path, document = f"/v1/models/{name}:predict", {"instances": array.tolist()}
        if ids is not None:
            document["ids"] = list(ids)
    else:
        tensor = {
            "name": "input",
            "shape": list(array.shape),
            "datatype": "FP32",
            "data": array.reshape(-1).tolist(),
        }
        path, document = f"/v2/models/{name}/infer", {"inputs": [tensor]}
        if ids is not None:
            document["parameters"] = {"ids": list(ids)}
    body = json.dumps(document, separators=(",", ":")).encode()
    return HttpCall("POST", path, body, rows=len(array))


def parse_prediction(protocol: Protocol, call: HttpCall, response: httpx.Response) -> PredictResult:
    """The outputs and weights version in a successful predict answer.

    Raises PredictError when the answer does not have that shape or not one row per row sent.
    """
    body = _json_object(response)
    try:
        outputs = _tf_outputs(body) if protocol == "tfserving" else _v2_outputs(body)
        version = int(body.get("model_version", response.headers.get(VERSION_HEADER)))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise _malformed(response, f"a {protocol} prediction", exc) from None
    if outputs.ndim == 0 or outputs.shape[0] != call.rows:
        got = "a scalar" if outputs.ndim == 0 else f"{outputs.shape[0]} rows"
        raise PredictError(response.status_code, f"the server sent {got} for {call.rows} rows")
    echoed = body.get("ids") if protocol == "tfserving" else body.get("parameters", {}).get("ids")
    return PredictResult(outputs, version, echoed)


def labels_call(
    model: str, ids: list[str | int], y: ArrayLike, w: ArrayLike | None = None
) -> HttpCall:
    """The request sending labels ``y`` (N, *target_shape) for the rows predicted as ``ids``."""
    document: dict[str, Any] = {"id": list(ids), "y": np.asarray(y, dtype=np.float64).tolist()}
    if w is not None:
        document["w"] = np.asarray(w, dtype=np.float64).tolist()
    body = json.dumps(document, separators=(",", ":")).encode()
    return HttpCall("POST", f"/v1/models/{quote(model, safe='')}/labels", body)


def parse_labels(response: httpx.Response) -> int:
    """How many labels the server forwarded to the learner."""
    try:
        return int(_json_object(response)["accepted"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(response, "a labels answer", exc) from None


def model_version_call(protocol: Protocol, model: str) -> HttpCall:
    """The status (tfserving) or metadata (v2) request for ``model``."""
    prefix = "/v1/models/" if protocol == "tfserving" else "/v2/models/"
    return HttpCall("GET", prefix + quote(model, safe=""))


def parse_model_version(protocol: Protocol, response: httpx.Response) -> int | None:
    """The newest version the model serves, or None while it has no weights yet."""
    body = _json_object(response)
    try:
        if protocol == "tfserving":
            entries = body["model_version_status"]
            versions = [int(e["version"]) for e in entries if e.get("state") == "AVAILABLE"]
        else:
            versions = [int(v) for v in body["versions"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _malformed(response, f"{protocol} model metadata", exc) from None
    return max(versions, default=None)


def error_message(response: httpx.Response) -> str:
    """The server's ``{"error": ...}`` message, or the start of whatever else it sent."""
    try:
        document = response.json()
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return document["error"]
    return response.text[:200] or response.reason_phrase


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait according to a Retry-After header: delay-seconds (livefit sends decimals)
    or an HTTP-date, measured from ``now``; a date in the past is 0. None when absent or unreadable.
    """
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return _seconds_until(value.strip(), now or datetime.now(UTC))
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def retry_delay_s(
    retry: int, max_backoff_s: float, retry_after_s: float | None, rng: random.Random
) -> float:
    """Seconds to sleep before retry number ``retry`` (0 is the first): the server's Retry-After
    when it sent one, else exponential backoff from 0.05 s with jitter; at most ``max_backoff_s``.
    """
    if retry_after_s is not None:
        return min(retry_after_s, max_backoff_s)
    ceiling = min(max_backoff_s, FIRST_BACKOFF_S * 2 ** min(retry, 60))
    return ceiling * rng.uniform(0.5, 1.0)  # jitter keeps many clients from retrying in step


def _rows(rows: ArrayLike) -> np.ndarray:
    with np.errstate(over="ignore"):  # too large for float32 becomes inf, refused below
        array = np.asarray(rows, dtype=np.float32)
    if array.ndim == 0 or len(array) == 0:
        raise ValueError(f"rows must have shape (N, *input_shape) with N >= 1, got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("rows hold NaN, infinity or numbers too large for float32")
    return array


def _tf_outputs(body: dict[str, Any]) -> np.ndarray:
    return np.asarray(body["predictions"], dtype=np.float32)


def _v2_outputs(body: dict[str, Any]) -> np.ndarray:
    tensor = body["outputs"][0]  # livefit models have exactly one output
    return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        document = response.json()
    except ValueError as exc:
        raise _malformed(response, "JSON", exc) from None
    if not isinstance(document, dict):
        raise _malformed(response, "a JSON object", TypeError(type(document).__name__))
    return document


def _malformed(response: httpx.Response, expected: str, exc: Exception) -> PredictError:
    return PredictError(
        response.status_code,
        f"the server's answer is not {expected} ({type(exc).__name__}: {exc})",
    )


def _seconds_until(http_date: str, now: datetime) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; the parser leaves "-0000" naive
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


# --- retries (pure) -------------------------------------------------------------------------------

Outcome = httpx.Response | httpx.TransportError


@dataclass(frozen=True, slots=True)
class _RetryPolicy:
    max_retries: int
    max_backoff_s: float
    statuses: frozenset[int]
    rng: random.Random


class _Attempts:
    """The retry decision for one call, told the outcome of each attempt in turn."""

    def __init__(self, policy: _RetryPolicy) -> None:
        self.policy = policy
        self.sent = 0

    def after(self, outcome: Outcome) -> httpx.Response | float:
        """The successful response to return, or seconds to wait before the next attempt.

        Raises PredictError when the outcome is a failure not worth retrying, or the last try.
        """
        self.sent += 1
        if isinstance(outcome, httpx.Response) and outcome.is_success:
            return outcome
        error, retryable = self._failure(outcome)
        if not retryable or self.sent > self.policy.max_retries:
            raise error
        return retry_delay_s(
            self.sent - 1, self.policy.max_backoff_s, error.retry_after, self.policy.rng
        )

    def _failure(self, outcome: Outcome) -> tuple[PredictError, bool]:
        if isinstance(outcome, httpx.TransportError):
            error = PredictError(0, _transport_message(outcome), attempts=self.sent)
            return error, isinstance(outcome, CONNECT_ERRORS)
        retry_after = parse_retry_after(outcome.headers.get("Retry-After"))
        error = PredictError(outcome.status_code, error_message(outcome), retry_after, self.sent)
        return error, outcome.status_code in self.policy.statuses


def _transport_message(exc: httpx.TransportError) -> str:
    try:
        where = f"{exc.request.method} {exc.request.url}"
    except RuntimeError:  # raised outside a request: no URL to show
        where = "the server"
    return f"{where} failed: {type(exc).__name__}: {str(exc) or 'no details'}"


# --- clients --------------------------------------------------------------------------------------

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
        self._policy = _RetryPolicy(
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

    def _attempts(self) -> _Attempts:
        return _Attempts(self._policy)


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
