"""HTTP servers as child processes: any (``HttpProcess``, ready when its health route answers
200) and livefit's own (``LivefitProcess``: ``livefit serve``/``replica`` with a config, and
its metrics). A server that exits or is not ready in time raises ``NotReady`` with the
problems its readiness route named and the end of its log.

Here, beside the commands, not in ``server/``: ``livefit demo`` runs its learner and replica
through it, and it reads metrics with ``livefit.clients.metrics``, which no server package may
import. The tests and the bench start their servers with the same class.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import httpx

from livefit.clients.metrics import MetricsReader, SampleKey
from livefit.server.runtime.local_process import LOOPBACK, LocalProcess, free_port, quiet_env

READINESS = "/v2/health/ready"
# Between readiness polls: a learner is ready 4 to 5 s after its start, and the suite starts
# some 300; at 0.2 s each start waited 0.1 s past readiness on average.
READY_POLL_S = 0.05


class NotReady(RuntimeError):
    """A server that exited, or was not ready in time; ``reason`` says which in a few words,
    the message adds the end of its log."""

    def __init__(self, name: str, reason: str, tail: str) -> None:
        super().__init__(f"{name} {reason}:\n{tail}")
        self.reason = reason


class HttpProcess(LocalProcess):
    """A child process serving HTTP on a loopback ``port``; ready when ``health`` answers 200."""

    def __init__(
        self, name: str, argv: Sequence[str], log: Path, port: int, health: str = READINESS, *,
        env: Mapping[str, str] | None = None, cwd: Path | None = None,
    ) -> None:  # fmt: skip
        super().__init__(name, argv, log, env=env, cwd=cwd)
        self.port = port
        self.health = health

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, ready_timeout_s: float | None = 120.0) -> Self:
        """Start and wait until ready (``wait_ready``); with None, return at once (to start a
        few that import TensorFlow side by side, then wait for each)."""
        super().start()
        if ready_timeout_s is not None:
            self.wait_ready(ready_timeout_s)
        return self

    def wait_ready(self, timeout: float = 120.0, stop: threading.Event | None = None) -> Self:
        """Return once ready; NotReady when it exits, ``stop`` is set or ``timeout`` passes
        (with the problems its readiness route last named)."""
        deadline = time.monotonic() + timeout
        problems: list[str] = []
        with httpx.Client(timeout=2.0) as client:
            while self.alive() and time.monotonic() < deadline:
                if stop is not None and stop.is_set():
                    raise NotReady(self.name, "was stopped while starting", self.tail())
                with contextlib.suppress(httpx.HTTPError):
                    response = client.get(self.url + self.health)
                    if response.status_code == 200:
                        return self
                    problems = _problems(response)
                if stop is not None:
                    stop.wait(READY_POLL_S)
                else:
                    time.sleep(READY_POLL_S)
        if self.process is not None and self.process.poll() is not None:
            raise NotReady(self.name, f"exited with status {self.process.returncode}", self.tail())
        said = f" ({'; '.join(problems)})" if problems else ""
        raise NotReady(self.name, f"was not ready after {timeout:.0f} s{said}", self.tail())


def _problems(response: httpx.Response) -> list[str]:
    """What a livefit readiness answer lists under ``problems`` (nothing for other bodies)."""
    try:
        body = response.json()
    except ValueError:
        return []
    problems = body.get("problems") if isinstance(body, dict) else None
    return [str(p) for p in problems] if isinstance(problems, list) else []


class LivefitProcess(HttpProcess):
    """``livefit <command> --config FILE --port N`` (serve, replica) as a child process.

    ``config`` is the config file, or TOML text written to ``workdir``/<name>.toml; the log
    is ``workdir``/<name>.log, where ``name`` defaults to "<command>-<port>". A livefit server
    writes a checkpoint on its way out, so ``stop`` waits up to a minute before SIGKILL.
    """

    stop_timeout_s = 60.0

    def __init__(
        self, config: str | Path, workdir: Path, command: str = "serve", *,
        name: str | None = None, port: int | None = None, env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:  # fmt: skip
        """``env``: the child's whole environment (default: ``quiet_env()``)."""
        port = port or free_port()
        name = name or f"{command}-{port}"
        workdir.mkdir(parents=True, exist_ok=True)
        if isinstance(config, str):
            (workdir / f"{name}.toml").write_text(config)
            config = workdir / f"{name}.toml"
        self.config, self.workdir, self.command = config, workdir, command
        argv = [sys.executable, "-m", "livefit", command, "--config", str(config),
                "--port", str(port)]  # fmt: skip
        env = quiet_env() if env is None else env
        super().__init__(name, argv, workdir / f"{name}.log", port, env=env, cwd=cwd)

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
