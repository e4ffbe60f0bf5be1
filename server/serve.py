"""Run the learner: build the runtime and the app, serve with uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import uvicorn  # noqa: E402

from livefit.server.app import create_app  # noqa: E402
from livefit.server.config import Settings  # noqa: E402
from livefit.server.runtime import LearnerRuntime  # noqa: E402

log = logging.getLogger(__name__)


def run_server(settings: Settings) -> int:
    """Serve until uvicorn receives SIGINT or SIGTERM; then stop everything in order."""
    runtime = LearnerRuntime(settings)
    app = create_app(runtime)
    config = uvicorn.Config(
        app,
        host=settings.http.host,
        port=settings.http.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
