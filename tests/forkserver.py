"""livefit's servers started from a preloaded interpreter: the suite's end-to-end tests start
some 250 ``livefit serve``/``replica`` processes, and each spent 2.3 s of its 3.3 s of CPU up to
readiness importing TensorFlow, Keras and livefit (docs/testing.md, "Preloaded starts").

One fork server per test worker (``python -m tests.forkserver SOCKET``, started on the first
launch, dying with the worker) imports them once, as ``livefit serve`` would, then forks a child
for each launch. The child becomes what ``python -m livefit ARGS`` would be: its own process
group, the parent-death signal, stdin from /dev/null, stdout and stderr to the log the test
opened, the test's environment and working directory (first on ``sys.path``, as ``-m`` puts
it), ``livefit``'s ``__main__`` run as the main module, and Python's own exit (threads joined,
atexit, the exit status). The test gets a ``subprocess.Popen`` whose ``poll`` and ``wait`` read
the status the fork server reaped; signals go to the real pid, as before.

What stays a fresh start (``launch`` falls back to ``children.start_child``): any command but
``python -m livefit``, an environment that differs from the fork server's in a variable read
while importing (``IMPORT_TIME_ENV``), and what starts within ``fresh_starts()`` (a test about
how a process starts: the split learner's supervisor never loading TensorFlow, for example).
``LIVEFIT_TEST_FRESH_PROCESSES=1`` starts every process fresh.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

FRESH_ENV = "LIVEFIT_TEST_FRESH_PROCESSES"
# Variables read while TensorFlow, Keras or Python start (the fork server read them once):
# a launch whose environment differs from the fork server's in one of these starts fresh.
IMPORT_TIME_ENV = ("TF_", "CUDA", "KERAS", "XLA", "OMP_", "MKL", "PYTHON", "LD_", "MALLOC",
                   "HOME", "NVIDIA", "TPU", "LANG", "LC_")  # fmt: skip
# The packages a livefit server imports before it is ready (the rest of its imports are small)
PRELOADED = ("livefit.server", "livefit.models")
MAX_REQUEST_BYTES = 1 << 20
SOCKET_PATH_MAX = 96  # a Unix socket's path is at most 107 bytes on Linux (and ".binding")


# Read at start too, but set up in the child as Python would have: the bench's processes run
# with PYTHONWARNINGS=ignore
WARNINGS_ENV = "PYTHONWARNINGS"


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` read while starting and importing, but PYTHONWARNINGS when it
    names only actions (``ignore``, ``default``...: ``warn_as_python_would``)."""
    picked = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}
    if ":" not in picked.get(WARNINGS_ENV, ":"):
        del picked[WARNINGS_ENV]
    return picked


def warn_as_python_would(env: Mapping[str, str]) -> None:
    """PYTHONWARNINGS' actions, each put first as Python's start puts them (an action alone
    applies to every warning)."""
    options = [o.strip() for o in env.get(WARNINGS_ENV, "").split(",") if o.strip()]
    sys.warnoptions[:] = options
    for action in options:
        warnings.simplefilter(action)  # type: ignore[arg-type]


# ---- the fork server (``python -m tests.forkserver SOCKET``) ----


def _preload() -> None:
    """Import what a livefit server imports, as it does: TensorFlow first, its start-up noise
    filtered, and its devices listed (the CUDA probe, once here rather than in every child;
    each child's ``import_tensorflow`` still logs what TensorFlow sees)."""
    from livefit.server.base import tensorflow_start

    tensorflow_start.quiet_tensorflow_env()
    with tensorflow_start.filtered_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices("GPU")
    import livefit.cli  # noqa: F401

    for package in PRELOADED:
        root = importlib.import_module(package)
        for module in pkgutil.walk_packages(root.__path__, f"{package}."):
            importlib.import_module(module.name)


def _serve(path: str) -> dict[str, Any]:
    """Fork a child for each request until this process is killed; returns only in a child,
    with its request."""
    from livefit.server.runtime.children import die_with_parent

    dies_with_this = die_with_parent()  # made here: it names this process as the parent
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.binding")
    listener.listen(64)
    os.rename(f"{path}.binding", path)  # the path appears once connections are accepted
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    print(f"fork server ready on {path}", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> the launcher's connection
    while True:
        readable, _, _ = select.select([listener, woken], [], [])
        if woken in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 4096)
            _reap(waiting)
        if listener in readable:
            connection, _ = listener.accept()
            request, log_fd = _read_request(connection)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for each in (listener, *waiting.values()):
                    each.close()
                os.close(woken)
                os.close(wake)
                _become(request, log_fd, connection, dies_with_this)
                return request
            os.close(log_fd)
            connection.sendall(f"{pid}\n".encode())
            waiting[pid] = connection
            _reap(waiting)  # a child may have ended before it was in ``waiting``


def _reap(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


def _read_request(connection: socket.socket) -> tuple[dict[str, Any], int]:
    data, fds, _, _ = socket.recv_fds(connection, 65536, 1)
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST_BYTES:
        more = connection.recv(65536)
        if not more:
            break
        data += more
    request: dict[str, Any] = json.loads(data)
    return request, fds[0]


def _become(
    request: dict[str, Any], log_fd: int, connection: socket.socket,
    dies_with_parent: Callable[[], None] | None,
) -> None:  # fmt: skip
    """In the child: what ``start_child`` and ``python -m livefit`` would have set up."""
    connection.close()
    os.setpgid(0, 0)
    os.environ.clear()
    os.environ.update(request["env"])
    if request["cwd"]:
        os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.path[0] = os.getcwd()  # ``-m`` puts the working directory first
    warn_as_python_would(os.environ)
    tempfile.tempdir = None  # found again from TMPDIR, as a fresh process finds it
    time.tzset()  # likewise the time zone from TZ
    sys.argv = ["livefit", *request["args"]]
    if dies_with_parent is not None:
        dies_with_parent()
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator anew
        import numpy as np

        np.random.seed()


def main(argv: Sequence[str]) -> None:
    import runpy

    _preload()
    _serve(argv[0])
    runpy.run_module("livefit", run_name="__main__", alter_sys=True)


# ---- the launcher, in the test worker ----


def supervises_only(args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``livefit ARGS`` is a group's parent, which never imports TensorFlow (a split
    learner's, a replica's worker group's): forking it saves nothing, and tests check that it
    maps no TensorFlow. A config that cannot be read is forked: the child says what is wrong."""
    from livefit.server.config.settings import ConfigError, load_settings

    if not args or args[0] not in ("serve", "replica") or "--config" not in args:
        return False
    try:
        settings = load_settings(args[args.index("--config") + 1], env)
    except (ConfigError, IndexError, OSError):
        return False
    if "--workers" in args:
        with contextlib.suppress(IndexError, ValueError):
            settings.http.workers = int(args[args.index("--workers") + 1])
    if args[0] == "serve":
        return settings.http.learner_workers() >= 1
    return settings.http.replica_workers() > 1


class ForkedChild(subprocess.Popen[bytes]):
    """A child of the fork server as a ``Popen``: ``pid`` is the real one (signals go to it);
    ``poll`` and ``wait`` read the exit status the fork server sends when it reaps the child
    (an exit status of -9 if the fork server itself is gone)."""

    def __init__(self, pid: int, connection: socket.socket, args: Sequence[str]) -> None:
        # Popen's own __init__ starts a process: only the attributes its other methods read
        self.args = list(args)
        self.pid = pid
        self.returncode: Any = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # nothing for Popen.__del__ to reap
        self._connection = connection
        self._received = b""
        self._reading = threading.Lock()  # a stop in one thread, a poll in another

    def poll(self) -> int | None:
        if self.returncode is None and self._reading.acquire(blocking=False):
            try:  # (while another thread reads, as Popen's poll: the status known so far)
                self._read_status(0.0)
            finally:
                self._reading.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            with self._reading:  # in slices, so that a poll elsewhere is not held up long
                self._read_status(0.1 if left is None else min(left, 0.1))
        return int(self.returncode)

    def __del__(self) -> None:
        self._connection.close()  # a child nobody waited for: no socket left to the collector

    def _read_status(self, timeout: float) -> None:
        if self.returncode is not None:
            return
        readable, _, _ = select.select([self._connection], [], [], timeout)
        if not readable:
            return
        chunk = self._connection.recv(4096)
        self._received += chunk
        if b"\n" in self._received:
            self.returncode = int(self._received.split(b"\n")[0].split()[1])
        elif not chunk:
            self.returncode = -signal.SIGKILL  # the fork server died, and its children with it
        if self.returncode is not None:
            self._connection.close()


class ForkServer:
    """This test worker's fork server, started on the first launch."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket_path = str(workdir / "forkserver.sock")
        if len(self.socket_path) > SOCKET_PATH_MAX:  # a long TMPDIR: a short directory instead
            self.socket_path = os.path.join(tempfile.mkdtemp(prefix="lf-fork-"), "socket")
        self.env: dict[str, str] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _start(self) -> None:
        from livefit.server.runtime.children import start_child
        from livefit.server.runtime.local_process import quiet_env

        self.workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.env = quiet_env()
        root = Path(__file__).resolve().parent.parent
        with (self.workdir / "forkserver.log").open("wb") as log:
            self.process = start_child([sys.executable, "-m", "tests.forkserver", self.socket_path],
                                       stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                       cwd=root)  # fmt: skip
        deadline = time.monotonic() + 120
        while not os.path.exists(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the fork server did not start: {(self.workdir / 'forkserver.log').read_text()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def can_launch(self, argv: Sequence[str], env: Mapping[str, str] | None) -> bool:
        """Whether ``argv`` is ``python -m livefit ...`` that runs models in its own process
        (``supervises_only``), with an environment this fork server imported under (the
        variables of ``IMPORT_TIME_ENV``)."""
        if list(argv[:3]) != [sys.executable, "-m", "livefit"]:
            return False
        if supervises_only(argv[3:], env if env is not None else os.environ):
            return False
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.env is not None
        given = import_time_env(env if env is not None else os.environ)
        return given == import_time_env(self.env)

    def launch(self, argv: Sequence[str], *, stdout: Any, env: Mapping[str, str] | None = None,
               cwd: Path | str | None = None, **popen: Any) -> ForkedChild:  # fmt: skip
        """``python -m livefit ARGS`` (``argv``) forked from the fork server, output to the open
        file ``stdout`` (stderr with it: the only way LocalProcess starts a child)."""
        assert popen.get("stderr") == subprocess.STDOUT and set(popen) <= {"stderr"}, popen
        request = {"args": list(argv[3:]), "env": dict(env if env is not None else os.environ),
                   "cwd": str(cwd) if cwd is not None else os.getcwd()}  # fmt: skip
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.socket_path)
        payload = json.dumps(request).encode() + b"\n"
        socket.send_fds(connection, [payload], [stdout.fileno()])
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = connection.recv(64)
            if not chunk:
                raise RuntimeError("the fork server closed the connection without a pid")
            answer += chunk
        return ForkedChild(int(answer), connection, argv)


_server: ForkServer | None = None


def use_fork_server(workdir: Path) -> None:
    """From now on start ``LivefitProcess`` children from a fork server (one per test worker,
    started on the first launch) where it can."""
    from livefit.local_servers import LivefitProcess

    global _server
    _server = ForkServer(workdir)
    LivefitProcess.launcher = staticmethod(launch)


def stop_fork_server() -> None:
    """Back to fresh starts, the fork server stopped."""
    from livefit.local_servers import LivefitProcess

    global _server
    if "launcher" in vars(LivefitProcess):
        delattr(LivefitProcess, "launcher")
    if _server is not None:
        _server.stop()
        _server = None


@contextlib.contextmanager
def fresh_starts() -> Iterator[None]:
    """Within: ``LivefitProcess`` children start as ``python -m livefit`` does, for a test about
    how a process starts (the split learner's supervisor never loads TensorFlow)."""
    with forking_from(None):
        yield


@contextlib.contextmanager
def forking_from(server: ForkServer | None) -> Iterator[None]:
    """Within: ``LivefitProcess`` children fork from ``server`` (None: they start fresh)."""
    from livefit.local_servers import LivefitProcess

    global _server
    kept, kept_launcher = _server, vars(LivefitProcess).get("launcher")
    _server = server
    LivefitProcess.launcher = staticmethod(launch)
    try:
        yield
    finally:
        _server = kept
        if kept_launcher is None:
            delattr(LivefitProcess, "launcher")
        else:
            LivefitProcess.launcher = kept_launcher


def launch(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``LivefitProcess.launcher`` while the fork server is in use: forked where it can be,
    else ``children.start_child``."""
    from livefit.server.runtime.children import start_child

    if _server is not None and _server.can_launch(argv, popen.get("env")):
        return _server.launch(argv, **popen)
    return start_child(argv, **popen)


if __name__ == "__main__":
    main(sys.argv[1:])
