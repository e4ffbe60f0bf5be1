"""When to try a prediction call again, as pure functions and one small class (no I/O): 429,
503 and connection failures are retried, after the server's Retry-After (seconds or an
HTTP-date) or an exponential backoff with jitter, at most ``max_retries`` times; every other
failure becomes a ``PredictError`` at once. A client holds one ``RetryPolicy``; each call makes
an ``Attempts`` from it and tells it each attempt's outcome.
"""

from __future__ import annotations

import email.utils
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from .predict_calls import PredictError, error_message

RETRY_STATUSES = frozenset({429, 503})
FIRST_BACKOFF_S = 0.05
# A connection that failed before the request reached the server: safe to send again.
CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)


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


def _seconds_until(http_date: str, now: datetime) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; the parser leaves "-0000" naive
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


Outcome = httpx.Response | httpx.TransportError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A client's retry settings: at most ``max_retries`` retries of ``statuses`` (and of
    connection failures), waits of at most ``max_backoff_s``, jitter drawn from ``rng``."""

    max_retries: int
    max_backoff_s: float
    statuses: frozenset[int]
    rng: random.Random


class Attempts:
    """The retry decision for one call, told the outcome of each attempt in turn."""

    def __init__(self, policy: RetryPolicy) -> None:
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
