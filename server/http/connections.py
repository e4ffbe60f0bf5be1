"""Connection limits uvicorn lacks: a request-head timeout, idle connections closed from the
start, a head-size limit and a cap on open connections that bounds file descriptors.

What uvicorn 0.54 offers, read in its source (``protocols/http/httptools_impl.py`` and
``h11_impl.py``): ``timeout_keep_alive`` arms a timer only after a response has been sent, and
any byte received cancels it; nothing times a request head. So a client that connects and sends
nothing, or sends its head one line every few seconds (slowloris), holds its connection and a
file descriptor forever. ``limit_concurrency`` still accepts every connection (one descriptor
each) and answers 503 only once a whole request head has arrived, so it protects neither
against slow heads nor the descriptor limit. ``h11_max_incomplete_event_size`` bounds the head's
size for the h11 protocol only.

So livefit runs uvicorn with its own subclass of uvicorn's httptools protocol (installed with
``uvicorn[standard]``), which adds, per server:

* **Request-head timeout** (``http.header_timeout_s``): a connection must deliver a whole request
  head within this long of opening, and of the first byte of each later request; otherwise it
  gets 408 and is closed (closed without a word if it sent nothing at all).
* **Idle timeout** (``http.keep_alive_timeout_s``) between requests, replacing uvicorn's
  keep-alive timer. Timeouts are deadlines checked by one sweep per server, not timers per
  request (see ``ConnectionTable``).
* **Head size** (``http.max_header_bytes``): a head that grows past it gets 431 and is closed.
* **Admission from the head** (with a runtime): a prediction request its model cannot admit
  (``early_admission.EarlyAdmission``) is answered 429 as soon as its head has arrived, without
  the ASGI app; its body is read and dropped (within ``http.body_timeout_s``) and the
  connection kept alive. An admitted one holds its place in the model's queue and goes
  straight to its endpoint (an ``AdmittedRequest``); the connection gives that place back
  when it closes or the response completes, should the endpoint not have.
* **Connection cap** (``http.max_connections``, lowered to fit the process's descriptor limit).
  At the cap, a new connection takes the place of the oldest *evictable* one, one that has no
  request in progress: idle between requests, or still sending its head (as nginx reuses idle
  keep-alive connections when it runs out). A well-behaved client is therefore served even while
  thousands of slow ones connect, and descriptors stay bounded. Only when every connection has a
  request in progress is the new one refused: ``503`` with ``Retry-After: 1`` and closed at once
  (nothing in that state lasts longer than ``http.body_timeout_s`` plus a request's deadline).
  uvicorn cannot stop accepting (HAProxy's ``maxconn`` leaves excess connections in the kernel's
  backlog instead); answering at once is what a load balancer in front can act on.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .connection_limits import (
    ConnectionLimits,
    close_response,
)
from .connection_table import ConnectionTable

if TYPE_CHECKING:
    from ..config.sections import HttpSettings
    from ..serve.admission import Reservation
    from .app import Runtime

NO_DEADLINE = math.inf
HEAD, DRAIN, IDLE = 1, 2, 3  # what a connection's deadline is for


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; ``table`` is set per server by
    ``protocol_class``."""

    table: ClassVar[ConnectionTable]
    REFUSED = close_response(
        503,
        "Service Unavailable",
        "too many connections, each with a request in progress; retry shortly",
        "retry-after: 1\r\n",
    )
    HEAD_TIMEOUT = close_response(408, "Request Timeout", "request head not received in time")
    HEAD_TOO_LARGE = close_response(
        431, "Request Header Fields Too Large", "request head larger than http.max_header_bytes"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = NO_DEADLINE  # when the sweep closes this connection, unless it moves
        self._expiry = HEAD
        self._head_bytes = -1  # bytes of the request head so far; -1: not in a head
        self._refused = False
        self._discard = False  # the request was answered by us: ignore the rest of it
        self._chunk = 0  # bytes of the read being parsed
        self._reservation: Reservation | None = None  # of the request admitted from its head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.table.opened(self):
            self._refused = True
            transport.write(self.REFUSED)
            transport.close()
            return
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline = NO_DEADLINE
        self.table.closed(self)
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():
            return
        if self._head_bytes >= 0:
            self._head_bytes += len(data)
        self._chunk = len(data)
        super().data_received(data)
        if self._head_bytes > self.table.limits.max_header_bytes:
            self._close("header_too_large", self.HEAD_TOO_LARGE)

    def on_message_begin(self) -> None:
        # uvicorn's builds the request's ASGI scope here (a dict, a copy of the app state); a
        # request answered from its head never needs one, so it is built in
        # on_headers_complete, only for a request that goes on (``_begin_scope``)
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        if self._head_bytes < 0:  # the first byte of a later request on this connection
            self._expect_head()
            self._head_bytes = 1  # (the read it came in is not counted: a byte, at least)

    def on_headers_complete(self) -> None:
        received, self._head_bytes = self._head_bytes + self._chunk, -1
        self.deadline = NO_DEADLINE
        # A head that arrived whole in one read was never over the limit while incomplete;
        # measured exactly only when what arrived with it could have been that large
        limit = self.table.limits.max_header_bytes
        if received > limit and (
            len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers) > limit
        ):
            self._discard = True
            self._close("header_too_large", self.HEAD_TOO_LARGE)
            return
        self.table.busy(self)
        admission = self.table.admission
        if (
            admission is not None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.flow.write_paused
        ):
            answer = admission(self.parser.get_method(), self.url, self.headers)
            if isinstance(answer, bytes):
                self._answer_from_head(answer)
                return
            if answer is not None:  # admitted: straight to the prediction endpoint
                self._reservation = answer.reservation
                app, self.app = self.app, answer
                try:
                    self._begin_scope()
                    super().on_headers_complete()
                finally:
                    self.app = app
                return
        self._begin_scope()
        super().on_headers_complete()

    def _begin_scope(self) -> None:
        """uvicorn's ``on_message_begin`` (the ASGI scope), run once the head is known to go
        on to an app, keeping the URL and headers parsed since."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.expect_100_continue = url, expect
        self.headers = self.scope["headers"] = headers

    def _answer_from_head(self, answer: bytes) -> None:
        """Send ``answer`` now; drop the body as it arrives; keep the connection if the client
        may reuse it."""
        self._discard = True
        keep_alive = (
            self.parser.should_keep_alive()
            and self.parser.get_http_version() == "1.1"
            and not self.expect_100_continue  # its body may never come
        )
        if keep_alive:
            self.transport.write(answer)
            self.table.idle(self)  # answered: nothing in progress while the body drains
            # the rest of the body must come within http.body_timeout_s, as for the app
            self._set_deadline(DRAIN, self.table.limits.body_timeout_s)
        else:
            closing = b"\r\nconnection: close\r\n\r\n"
            self.transport.write(answer.replace(b"\r\n\r\n", closing, 1))
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        if not self._discard:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._discard:
            super().on_message_complete()
            return
        self._discard = False  # a request answered from its head is now complete
        if not self.transport.is_closing():
            self._set_deadline(IDLE, self.table.limits.keep_alive_timeout_s)

    def on_response_complete(self) -> None:
        """uvicorn's, with the keep-alive timeout as a deadline for the sweep, not a timer."""
        self._release()  # the app gave it back already, unless it failed early
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._set_deadline(IDLE, self.table.limits.keep_alive_timeout_s)
            self.table.idle(self)

    def evict(self) -> None:
        """Closed to make room for a new connection (it had no request in progress)."""
        self.deadline = NO_DEADLINE
        if not self.transport.is_closing():
            self.transport.close()

    def expire(self) -> None:
        """Past its deadline (called by the table's sweep)."""
        self.deadline = NO_DEADLINE
        if self._expiry == HEAD and self._head_bytes <= 0:
            # not a byte of a request: an idle connection, closed without a word (a 408 could
            # cross a request the client is sending just now, and be taken as its answer)
            self._close("idle", b"")
        elif self._expiry == HEAD:
            self._close("header_timeout", self.HEAD_TIMEOUT)
        elif self._expiry == DRAIN:
            self._close("body_timeout", b"")  # the request was answered already
        else:
            self._close("idle", b"")

    def _expect_head(self) -> None:
        self._head_bytes = 0
        self._set_deadline(HEAD, self.table.limits.header_timeout_s)

    def _set_deadline(self, expiry: int, seconds: float) -> None:
        self._expiry = expiry
        self.deadline = time.monotonic() + seconds

    def _release(self) -> None:
        """Give back the place of the request admitted from its head, if not done yet."""
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            reservation.release()

    def _close(self, reason: str, response: bytes) -> None:
        """Answer ``response`` (unless another response is under way) and close."""
        self._head_bytes = -1
        self.deadline = NO_DEADLINE
        if self.transport.is_closing():
            return
        self.table.count(reason)
        if response and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(response)
        self.transport.close()


def protocol_class(http: HttpSettings, runtime: Runtime | None = None) -> type[asyncio.Protocol]:
    """A protocol class for one uvicorn server (``uvicorn.Config(http=...)``), with its own
    table of connections; with a ``runtime`` (its ``endpoints()`` models and ``metrics``), it
    also refuses prediction requests from their heads (``EarlyAdmission``)."""
    metrics = runtime.metrics if runtime is not None else None
    admission = None
    if runtime is not None:
        from .auth import TokenGuard
        from .early_admission import EarlyAdmission

        token = http.token_bytes() if http.protect_predictions else None
        guard = TokenGuard(token).check if token is not None else None
        admission = EarlyAdmission(
            runtime.endpoints, runtime.metrics, token, guard, http.body_timeout_s
        )
    table = ConnectionTable(ConnectionLimits.from_settings(http), metrics, admission)
    return type("LivefitHttpProtocol", (LimitedHttpProtocol,), {"table": table})
