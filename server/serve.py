"""Run a learner or replica runtime behind uvicorn until SIGINT or SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import uvicorn

from livefit.server.app import Runtime, create_app
from livefit.server.config import Settings

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after a graceful shutdown (exit status -15); we exit 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def run_server(settings: Settings, runtime: Runtime) -> int:
    """Serve ``runtime`` until SIGINT or SIGTERM; then stop everything in order; 0 if clean."""
    app = create_app(runtime)
    config = uvicorn.Config(
        app,
        host=settings.http.host,
        port=settings.http.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    server = _Server(config)
    server.run()
    return 0 if server.started else 1
