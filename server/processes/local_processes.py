"""Local child processes: free ports, a mosquitto broker, livefit (or any HTTP) servers.

One toolkit for every side that starts processes on this machine: ``livefit serve`` (its
``auto`` broker), the demo, the tests and the benchmarks. Every process started here keeps
``children``'s promises: it dies with the process that started it and runs in its own process
group, so a terminal's Ctrl-C reaches only the parent, which stops its children itself and in
its own order (``stop_all``). Output goes to a log file; an error about a process that did not
come up ends with the last lines of that log.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self

import httpx

from livefit.clients.metrics import MetricsReader, SampleKey
from livefit.server.processes.children import start_child

LOOPBACK = "127.0.0.1"
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
READINESS = "/v2/health/ready"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_listening(
    host: str, port: int, alive: Callable[[], bool], what: str, timeout: float = 10.0
) -> None:
    """Return once host:port accepts connections; RuntimeError when ``alive()`` turns False
    first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited before listening on {host}:{port}")
        if is_listening(host, port, timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")


def quiet_env(**extra: str) -> dict[str, str]:
    """This process's environment with TensorFlow's chatter off and unbuffered Python output."""
    return {**os.environ, **QUIET_ENV, **extra}


class LocalProcess:
    """One command in a child process (``children.start_child``) with its output in ``log``;
    a context manager that stops it."""

    stop_timeout_s = 20.0  # SIGTERM, then SIGKILL after this long
    log_mode = "wb"

    def __init__(
        self, name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:  # fmt: skip
        """``env``: the child's whole environment (None: this process's)."""
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open(self.log_mode) as out:
            self.process = start_child(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
            )
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log ("(no log)" when there is none)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def fail_if_exited(self) -> None:
        """RuntimeError with the end of the log when the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")

    def terminate(self) -> None:
        """SIGTERM to the process group at once (``stop`` waits for the exit)."""
        if self.alive():
            _signal_group(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process group at once."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int | None:
        """Send ``sig`` to the process group, SIGKILL it after ``timeout`` (default
        ``stop_timeout_s``); the exit code, None if it was not started. Whatever else runs in
        the group is killed too, even when the process itself exited cleanly."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, sig)
        try:
            code = process.wait(self.stop_timeout_s if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            code = process.wait(10)
        _signal_group(process.pid, signal.SIGKILL)  # leftovers in its group (none, normally)
        return code

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group a child leads (``start_child`` puts each in its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_all(processes: Sequence[LocalProcess], timeout: float | None = None) -> None:
    """Stop ``processes`` together: all are signalled at once, then awaited last-started first
    within one shared ``timeout`` (default: each one's own), so graceful shutdowns overlap.
    Never raises: it runs on the way out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for process in reversed(processes):
        with contextlib.suppress(Exception):
            process.terminate()
    for process in reversed(processes):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        with contextlib.suppress(Exception):
            process.stop(timeout=left)


@contextlib.contextmanager
def running(*processes: LocalProcess) -> Iterator[None]:
    """Stop every process on the way out (``stop_all``), whatever happened."""
    try:
        yield
    finally:
        stop_all(processes)


class Mosquitto(LocalProcess):
    """A mosquitto broker on a (free) loopback port, restartable on the same port; it logs to
    ``workdir``/mosquitto.log and, with ``persistence``, keeps its database in ``workdir``.

    Unless ``debian_defaults``, it is set up not to drop anything (a million queued messages
    per client); with it, only what Debian's stock mosquitto.conf sets (persistence) applies,
    so mosquitto's own limits do (1,000 queued messages per client). ``extra_config`` is
    appended; a ``password_file`` in it turns anonymous access off. ``kind``, ``protocol`` and
    ``stop`` make it a ``broker.ManagedBroker`` for ``livefit serve`` and the demo.
    """

    kind = "mosquitto"
    protocol = "5"
    stop_timeout_s = 10.0
    log_mode = "ab"  # one log across restarts

    def __init__(
        self, workdir: Path, port: int | None = None, *, host: str = LOOPBACK,
        persistence: bool = True, debian_defaults: bool = False, extra_config: str = "",
    ) -> None:  # fmt: skip
        if shutil.which("mosquitto") is None:
            raise RuntimeError("mosquitto is not on PATH (apt-get install mosquitto)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.host, self.port = workdir, host, port or free_port(host)
        self.persistence, self.debian_defaults = persistence, debian_defaults
        self.extra_config = extra_config
        self.conf = workdir / "mosquitto.conf"
        argv = ["mosquitto", "-c", str(self.conf)]
        super().__init__("mosquitto", argv, workdir / "mosquitto.log")

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config_text(self) -> str:
        anonymous = "false" if "password_file" in self.extra_config else "true"
        user = "user root\n" if os.geteuid() == 0 else ""
        kept = (
            f"persistence true\npersistence_location {self.workdir}/\n"
            if self.persistence
            else "persistence false\n"
        )
        limits = "" if self.debian_defaults else (
            ("autosave_interval 1\n" if self.persistence else "")
            + "max_queued_messages 1000000\nmax_inflight_messages 1000\n"
        )  # fmt: skip
        return (
            f"listener {self.port} {self.host}\nallow_anonymous {anonymous}\n{user}{kept}{limits}"
            f"log_dest stdout\n{self.extra_config}"
        )

    def start(self, timeout: float = 10.0) -> Self:
        """Start and return once it listens; RuntimeError with its log's end if it does not."""
        self.conf.write_text(self.config_text())
        super().start()
        try:
            wait_listening(self.host, self.port, self.alive, "mosquitto", timeout)
        except RuntimeError as exc:
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"{exc}:\n{self.tail()}") from None
        return self

    def restart(self, sig: int = signal.SIGTERM) -> Self:
        """Stop with ``sig`` and start again on the same port, with the same database."""
        self.stop(sig)
        return self.start()


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
                    stop.wait(0.2)
                else:
                    time.sleep(0.2)
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
