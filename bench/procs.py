"""What benchmarks add to the process toolkit (``livefit.server.runtime.local_process``,
``livefit.server.runtime.mosquitto``, ``livefit.local_servers``): their
environment and working directory, starting servers together, and tools whose output lines
the bench reads.

Every process is started on a free loopback port and stopped by whoever started it (``with``,
``running`` or ``try/finally``): SIGTERM, then SIGKILL after a grace period. Logs go to files
in the run's work directory, and the last lines are shown when a process fails to come up.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.config import relocated
from bench.harness import REPO
from livefit.local_servers import HttpProcess, LivefitProcess
from livefit.server.runtime.children import start_child
from livefit.server.runtime.local_process import QUIET_ENV as BASE_QUIET_ENV
from livefit.server.runtime.local_process import LocalProcess, quiet_env, stop_all
from livefit.server.runtime.mosquitto import Mosquitto

QUIET_ENV = {**BASE_QUIET_ENV, "PYTHONWARNINGS": "ignore"}


@contextlib.contextmanager
def running(*processes: LocalProcess) -> Iterator[None]:
    """Stop every process on the way out, whatever happened: the others together
    (``stop_all``), then the brokers, so that no server shuts down with its broker gone (a
    learner and a replica whose broker went with them took 5 to 9 s to stop here, 1 s with it)."""
    try:
        yield
    finally:
        stop_all([p for p in processes if not isinstance(p, Mosquitto)])
        stop_all([p for p in processes if isinstance(p, Mosquitto)])


def bench_env() -> dict[str, str]:
    """This process's environment, quiet: what every process a benchmark starts gets."""
    return quiet_env(PYTHONWARNINGS="ignore")


def http_server(
    name: str, argv: Sequence[str], workdir: Path, port: int, health: str
) -> HttpProcess:
    """A peer or helper serving HTTP on ``port``, run from the repository (not yet started)."""
    return HttpProcess(name, argv, workdir / f"{name}.log", port, health, env=bench_env(), cwd=REPO)


def livefit_server(
    name: str, config_text: str, workdir: Path, command: str = "serve"
) -> LivefitProcess:
    """``livefit serve|replica --config FILE --port N`` as a child process (not yet started)."""
    return LivefitProcess(config_text, workdir, command, name=name, env=bench_env(), cwd=REPO)


def start_all(servers: Sequence[HttpProcess], timeout: float = 180.0) -> None:
    """Start ``servers`` together (their imports overlap) and wait until each is ready."""
    for server in servers:
        server.start(ready_timeout_s=None)
    wait_all(servers, timeout)


def wait_all(servers: Sequence[HttpProcess], timeout: float = 180.0) -> None:
    """Wait until every started server is ready; the first failure is raised."""
    errors: list[BaseException] = []

    def wait(server: HttpProcess) -> None:
        try:
            server.wait_ready(timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(s,), name=f"wait-{s.name}") for s in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class LineReader:
    """Reads a child's stdout lines in a thread, so a benchmark can wait for a given line."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="line-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str:
        """The first line starting with ``prefix``; RuntimeError on timeout or exit."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.process.poll() is not None and self._drained()):
                    tail = "\n".join(self.lines[-20:])
                    raise RuntimeError(f"no line {prefix!r} within {timeout:.0f} s:\n{tail}")
                self._changed.wait(min(remaining, 0.2))

    def _drained(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)


class ToolProcess(LocalProcess):
    """A bench tool (``python -m bench.<module> ...``) whose stdout lines the bench reads; its
    stderr goes to ``log``."""

    stop_timeout_s = 10.0

    def __init__(self, module: str, args: Sequence[Any], log: Path) -> None:
        argv = [sys.executable, "-m", module, *[str(a) for a in args]]
        super().__init__(module, argv, log, env=bench_env(), cwd=REPO)
        self.reader: LineReader | None = None

    def start(self) -> ToolProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as stderr:
            self.process = start_child(
                self.argv, stdout=subprocess.PIPE, stderr=stderr, env=self.env, cwd=self.cwd
            )
        self.reader = LineReader(self.process)
        return self

    def wait_for(self, prefix: str, timeout: float) -> str:
        assert self.reader is not None
        try:
            return self.reader.wait_for(prefix, timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{' '.join(self.argv[2:4])}: {exc}\n{self.tail()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int | None:
        code = super().stop(sig, timeout)
        if self.reader is not None:
            self.reader.join()
            self.reader = None
        return code


def own_learner(
    config_text: str, workdir: Path, name: str, workers: int
) -> tuple[Mosquitto, LivefitProcess]:
    """A mosquitto and a learner (not started) of the models in ``config_text`` (another
    learner's), on that broker and their own storage under ``workdir``, with ``http.workers``
    ``workers`` (0: one process; N: a training process and N serving processes)."""
    broker = Mosquitto(workdir / f"{name}-broker")
    text = relocated(config_text, broker.url, str(workdir / f"{name}-data"), workers)
    return broker, livefit_server(name, text, workdir)


@contextlib.contextmanager
def started_own_learner(
    config_text: str, workdir: Path, name: str, workers: int
) -> Iterator[tuple[Mosquitto, LivefitProcess]]:
    """``own_learner``'s broker and learner, started (the learner given 240 s to be ready:
    a split one starts two TensorFlow processes), and stopped on leaving."""
    broker, learner = own_learner(config_text, workdir, name, workers)
    with running(broker, learner):
        broker.start()
        learner.start(ready_timeout_s=240)
        yield broker, learner
