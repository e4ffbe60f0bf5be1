"""Child processes a benchmark starts: mosquitto, livefit learners and replicas, peers, tools.

Every process is started on a free loopback port and stopped by whoever started it (``with``
or ``try/finally``): SIGTERM, then SIGKILL after a grace period. Logs go to files in the run's
work directory, and the last lines are shown when a process fails to come up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.harness import REPO
from livefit.clients.metrics import MetricsReader, SampleKey
from livefit.server.children import die_with_parent

QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ChildProcess:
    """One command in a child process, its output in ``log``; a context manager that stops it."""

    def __init__(
        self, name: str, argv: Sequence[str], workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / f"{name}.log"
        self.env = {**os.environ, **QUIET_ENV, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.process.pid

    def start(self) -> ChildProcess:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=REPO,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def fail_if_exited(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")

    def terminate(self) -> None:
        """SIGTERM to the process and its children, at once (``stop`` waits for the exit)."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code (None if never started).

        Whatever the process started in its session (LitServe's workers and API servers) is
        ended too, even when the process itself exited cleanly.
        """
        process, self.process = self.process, None
        if process is None:
            return None
        return _stop(process, timeout)

    def __enter__(self) -> ChildProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen[Any], sig: int) -> None:
    """Signal the process group we started the process in (``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _stop(process: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM the process's group, wait, SIGKILL it on timeout; then end its leftovers."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        code = process.wait(10)
    _signal_group(process, signal.SIGKILL)  # children that outlived it (none, normally)
    return code


class HttpServer(ChildProcess):
    """A child process serving HTTP on ``port``; ``start`` waits until ``health`` answers 200."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        workdir: Path,
        port: int,
        health: str,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name, argv, workdir, env)
        self.port = port
        self.health = health

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> HttpServer:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self.fail_if_exited()
                try:
                    if client.get(self.url + self.health).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready within {timeout:.0f} s:\n{self.tail()}")

    def metrics(self) -> dict[SampleKey, float]:
        """Every sample of /metrics as {(name, sorted labels): value}."""
        return MetricsReader(self.url).samples()

    def metric(self, name: str, **labels: str) -> float:
        return MetricsReader(self.url).value(name, **labels)


def start_all(servers: Sequence[HttpServer], timeout: float = 180.0) -> None:
    """Start ``servers`` together (their imports overlap) and wait until each is ready."""
    for server in servers:
        server.start()
    wait_all(servers, timeout)


def wait_all(servers: Sequence[HttpServer], timeout: float = 180.0) -> None:
    """Wait until every started server is ready; the first failure is raised."""
    errors: list[BaseException] = []

    def wait(server: HttpServer) -> None:
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


def livefit_server(
    name: str, config_text: str, workdir: Path, command: str = "serve"
) -> HttpServer:
    """``livefit serve|replica --config FILE --port N`` as a child process (not yet started)."""
    port = free_port()
    config = workdir / f"{name}.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    config.write_text(config_text)
    argv = [sys.executable, "-m", "livefit", command, "--config", str(config), "--port", str(port)]
    return HttpServer(name, argv, workdir, port, "/v2/health/ready")


class Mosquitto(ChildProcess):
    """A mosquitto broker on a free loopback port, configured the same for every side."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("mosquitto") is None:
            raise RuntimeError("mosquitto is not on PATH (apt-get install mosquitto)")
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "mosquitto.conf"
        user = "user root\n" if os.geteuid() == 0 else ""
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            f"{user}"
            "persistence false\n"
            "max_queued_messages 1000000\n"
            "max_inflight_messages 1000\n"
            f"log_dest file {workdir / 'mosquitto-broker.log'}\n"
        )
        super().__init__("mosquitto", ["mosquitto", "-c", str(conf)], workdir)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> Mosquitto:
        super().start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.fail_if_exited()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout:.0f} s")


@contextlib.contextmanager
def running(*processes: ChildProcess) -> Iterator[None]:
    """Stop every process on the way out, whatever happened.

    All are signalled at once, then awaited (the last started first), so their graceful
    shutdowns overlap; a process that does not exit in time is killed.
    """
    try:
        yield
    finally:
        for process in reversed(processes):
            with contextlib.suppress(Exception):
                process.terminate()
        for process in reversed(processes):
            with contextlib.suppress(Exception):
                process.stop()


class LineReader:
    """Reads a child's stdout lines in a thread, so a benchmark can wait for a given line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="line-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
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


class ToolProcess:
    """A bench tool (``python -m bench.<module> ...``) whose stdout lines the bench reads."""

    def __init__(self, module: str, args: Sequence[Any], log: Path) -> None:
        self.argv = [sys.executable, "-m", module, *[str(a) for a in args]]
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.reader: LineReader | None = None

    def start(self) -> ToolProcess:
        env = {**os.environ, **QUIET_ENV}
        self._stderr = self.log.open("w")
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        self.reader = LineReader(self.process)
        return self

    def wait_for(self, prefix: str, timeout: float) -> str:
        assert self.reader is not None
        try:
            return self.reader.wait_for(prefix, timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{' '.join(self.argv[2:4])}: {exc}\n{self._log_tail()}") from None

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            _stop(process, timeout)
        if self.reader is not None:
            self.reader.join()
            self.reader = None
        if getattr(self, "_stderr", None) is not None:
            self._stderr.close()

    def __enter__(self) -> ToolProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
