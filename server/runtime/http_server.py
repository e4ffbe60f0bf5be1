"""Run a learner or replica runtime behind uvicorn until SIGINT, SIGTERM or SIGHUP.

What can fail cheaply fails first, before any model is built or any broker connection made
(a second learner must not kick the first off the broker, restore its checkpoints or publish
weights before it finds the port taken): the runtime's preflight (the learner locks its
storage directory), then the listening socket is bound, and only then does uvicorn start the
app, whose lifespan starts the runtime.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn

from ..base.metrics_merge import WorkerMetrics
from ..config.settings import Settings
from ..http.app import Runtime, create_app
from ..http.connections import protocol_class
from .listening import StartupError, bind_socket
from .stop_signals import stop_signals
from .workers import WorkerSlot

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after a graceful shutdown (exit status -15); we exit 0. SIGHUP
    stops it as SIGTERM does (uvicorn leaves it to its default action, which kills), unless
    this process ignores it (``stop_signals.py``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        hangup = (
            signal.SIGHUP in stop_signals()
            and threading.current_thread() is threading.main_thread()
        )  # fmt: skip
        previous = signal.signal(signal.SIGHUP, self._hang_up) if hangup else None
        try:
            with super().capture_signals():
                yield
                self._captured_signals.clear()
        finally:
            if hangup:
                signal.signal(signal.SIGHUP, previous)

    def _hang_up(self, _signum: int, frame: FrameType | None) -> None:
        log.info("SIGHUP: stopping, as on SIGTERM")
        self.handle_exit(signal.SIGTERM, frame)


def run_server(settings: Settings, runtime: Runtime, worker: WorkerSlot | None = None) -> int:
    """Serve ``runtime`` until SIGINT, SIGTERM or SIGHUP; then stop everything in order; 0 if
    clean, 1 if the app failed to start, 2 if a check before start failed (message on stderr).
    As one of a worker group's processes (``worker``), on the socket the group bound."""
    from ..storage.lock import StorageLocked

    try:
        runtime.preflight()
        if worker is not None:
            sock = worker.listening_socket()
        else:
            sock = bind_socket(settings.http.host, settings.http.port)
    except (StartupError, StorageLocked) as exc:
        runtime.stop()
        print(f"livefit: {exc}", file=sys.stderr)
        return 2
    group = None
    if worker is not None:
        group = WorkerMetrics(
            runtime.metrics.registry, str(worker.index), worker.peers(), worker.directory
        )
    app = create_app(runtime, group, worker.heartbeat_file() if worker is not None else None)
    config = uvicorn.Config(
        app,
        host=settings.http.host,
        port=settings.http.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
        # uvicorn has no request-head timeout, and its limit_concurrency accepts every connection
        # (a descriptor each) to answer 503: livefit's protocol times heads, closes idle
        # connections and caps them (http.header_timeout_s, keep_alive_timeout_s,
        # max_connections, max_header_bytes; see server/http/connections.py)
        http=protocol_class(settings.http, runtime),
    )
    server = _Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        runtime.stop()  # idempotent; releases the storage lock if the app never started
    return 0 if server.started else 1
