"""Run ``livefit`` as a real child process on free ports, and read its metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from livefit.clients.metrics import MetricsReader, SampleKey
from livefit.server.children import die_with_parent
from tests.mqtt_broker import free_port


class ServerProcess:
    """``livefit <command> --config <file>`` in a child process, stopped with SIGTERM."""

    def __init__(self, config_text: str, workdir: Path, command: str = "serve") -> None:
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / f"{command}-{self.port}.toml"
        self.config.write_text(config_text)
        self.log = workdir / f"{command}-{self.port}.log"
        self.command = command
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> ServerProcess:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "livefit", self.command, "--config", str(self.config),
                 "--port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=die_with_parent(),  # no learner outlives a killed test run
            )  # fmt: skip
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log.read_text()[-4000:]}")

    def metrics(self) -> dict[SampleKey, float]:
        """Every sample of /metrics as {(name, sorted labels): value}."""
        return MetricsReader(self.url).samples()

    def metric(self, name: str, **labels: str) -> float:
        return MetricsReader(self.url).value(name, **labels)

    def wait_for_metric(
        self, name: str, value: float, timeout: float = 60.0, **labels: str
    ) -> float:
        """Poll until the metric reaches ``value``; return the last value seen."""
        deadline = time.monotonic() + timeout
        current = self.metric(name, **labels)
        while current < value and time.monotonic() < deadline:
            time.sleep(0.1)
            current = self.metric(name, **labels)
        return current

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        self.process = None
        return code
