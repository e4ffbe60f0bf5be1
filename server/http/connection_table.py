"""The open connections of one HTTP server (``ConnectionTable``): the cap with eviction of the
oldest evictable connection, the one sweep that enforces every connection's deadline, and the
close counters. The protocol that registers with it is ``connections.LimitedHttpProtocol``."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from .connection_limits import CLOSE_REASONS, ConnectionLimits
from .metrics import HttpMetrics

if TYPE_CHECKING:
    from ..base.metrics import Metrics
    from .connections import LimitedHttpProtocol
    from .early_admission import AdmittedRequest

Admission = Callable[[bytes, bytes, list[tuple[bytes, bytes]]], "bytes | AdmittedRequest | None"]


class ConnectionTable:
    """The open connections of one server: the evictable ones (no request in progress) in the
    order they became so, oldest first, and one sweep that closes those past their deadline.

    Deadlines are checked by a sweep a few times a second rather than a timer per request
    (uvicorn arms and cancels one per request): under overload the server handles thousands
    of requests a second, and the timers cost more than the refusals. A timeout therefore
    acts up to a sweep interval late (a quarter of the shortest timeout, at most 0.5 s).
    ``admission(method, url, headers)`` answers a request from its head alone (a whole
    response), admits it (the app that serves it, with its place in its model's queue) or
    returns None."""

    def __init__(
        self, limits: ConnectionLimits, metrics: Metrics | None = None,
        admission: Admission | None = None,
    ) -> None:  # fmt: skip
        self.limits = limits
        self.admission = admission
        self.members: set[LimitedHttpProtocol] = set()
        self.evictable: OrderedDict[LimitedHttpProtocol, None] = OrderedDict()
        shortest = min(limits.header_timeout_s, limits.keep_alive_timeout_s, limits.body_timeout_s)
        self.sweep_interval_s = min(0.5, max(0.01, shortest / 4))
        self._sweeping: asyncio.TimerHandle | None = None
        if metrics is not None:
            metrics.group(HttpMetrics)
        self._gauge = metrics.group(HttpMetrics).http_connections if metrics is not None else None
        self._closed = (
            {
                r: metrics.group(HttpMetrics).http_connections_closed.labels(reason=r)
                for r in CLOSE_REASONS
            }
            if metrics is not None
            else {}
        )

    def opened(self, conn: LimitedHttpProtocol) -> bool:
        """Take ``conn`` in, evicting the oldest evictable connection at the cap; False when
        every connection is busy (``conn`` must then be refused)."""
        if len(self.members) >= self.limits.max_connections:
            if not self.evictable:
                self.count("refused")
                return False
            victim, _ = self.evictable.popitem(last=False)
            self.members.discard(victim)
            self.count("evicted")
            victim.evict()
        self.members.add(conn)
        self.evictable[conn] = None
        self._changed()
        if self._sweeping is None:
            self._sweeping = conn.loop.call_later(self.sweep_interval_s, self._sweep, conn.loop)
        return True

    def closed(self, conn: LimitedHttpProtocol) -> None:
        self.evictable.pop(conn, None)
        if conn in self.members:
            self.members.discard(conn)
            self._changed()

    def busy(self, conn: LimitedHttpProtocol) -> None:
        self.evictable.pop(conn, None)

    def idle(self, conn: LimitedHttpProtocol) -> None:
        if conn in self.members:
            self.evictable[conn] = None
            self.evictable.move_to_end(conn)

    def count(self, reason: str) -> None:
        counter = self._closed.get(reason)
        if counter is not None:
            counter.inc()

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.monotonic()
        for conn in [c for c in self.members if c.deadline <= now]:
            conn.expire()
        if self.members:
            self._sweeping = loop.call_later(self.sweep_interval_s, self._sweep, loop)
        else:
            self._sweeping = None  # restarted by the next connection

    def _changed(self) -> None:
        if self._gauge is not None:
            self._gauge.set(len(self.members))
