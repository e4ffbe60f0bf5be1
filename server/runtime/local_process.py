"""One command in a child process (``LocalProcess``), stopping several together (``stop_all``),
and waiting for a port (``free_port``, ``wait_listening``).

A ``LocalProcess`` keeps ``children``'s promises: it dies with the process that started it and
runs in its own process group, which ``stop`` signals whole. Output goes to a log file whose
end ``tail`` gives for error messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Self

from .children import start_child, stat_fields

LOOPBACK = "127.0.0.1"
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


# "LOW-HIGH": the ports ``free_port`` hands out. The test kit gives each test worker its own range
# below the kernel's ephemeral ports, so neither the other worker nor an outgoing connection can
# take a port between ``free_port`` and the child's bind (a race that failed CI runs).
FREE_PORTS_ENV = "LIVEFIT_FREE_PORTS"
_next_in_range: dict[tuple[int, int], int] = {}


def port_range(text: str) -> tuple[int, int]:
    """``"LOW-HIGH"`` as two ports, LOW <= HIGH; ValueError naming the text otherwise."""
    low_text, sep, high_text = text.partition("-")
    if sep and low_text.strip().isascii() and high_text.strip().isascii():
        with contextlib.suppress(ValueError):
            low, high = int(low_text), int(high_text)
            if 1 <= low <= high <= 65535:
                return low, high
    raise ValueError(f"{FREE_PORTS_ENV}={text!r}: expected LOW-HIGH, two ports with LOW <= HIGH")


def can_bind(host: str, port: int) -> bool:
    """Whether a TCP socket can bind ``host:port`` now (nothing listens there, nor lingers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that nothing listens on right now: the next free one of
    ``LIVEFIT_FREE_PORTS`` when it is set (each process walks the range from its own starting
    point, so a parent and its child rarely meet), else one the kernel picks."""
    text = os.environ.get(FREE_PORTS_ENV)
    if not text:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    low, high = port_range(text)
    size = high - low + 1
    start = _next_in_range.get((low, high), low + (os.getpid() * 7919) % size)
    for step in range(size):
        port = low + (start - low + step) % size
        if can_bind(host, port):
            _next_in_range[(low, high)] = low + (port - low + 1) % size
            return port
    raise RuntimeError(f"{FREE_PORTS_ENV}={text}: no free port on {host} in that range")


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
    # What starts the child: ``start_child``; the test suite starts livefit's own servers from
    # a preloaded interpreter instead (tests/forkserver.py)
    launcher: ClassVar[Callable[..., subprocess.Popen[bytes]]] = staticmethod(start_child)

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
            self.process = self.launcher(
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
        _wait_group_gone(process.pid)
        return code

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    """Wait (at most ``timeout_s``) until no live process of the group ``pgid`` is left (a
    zombie waiting to be reaped holds nothing): a SIGKILLed split learner's serving processes
    hold its listening socket until they are gone, and a restart on the same port right after
    found it still in use (CI, 2026-11-27). Where /proc cannot be read, no wait."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs (not a zombie), by /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fields = stat_fields(entry)
        except OSError:
            continue
        if int(fields[5 - 3]) == pgid and fields[0] != "Z":  # field 5 the group, 3 the state
            return True
    return False


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
