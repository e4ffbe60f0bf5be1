"""Serve an app with a real uvicorn on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

from livefit.server.runtime.local_process import free_port


class InProcessServer:
    """uvicorn in a background thread; ``stop`` shuts it down through the app's lifespan."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, lifespan="on",
            access_log=False,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start (see the log above)")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "uvicorn did not stop"
