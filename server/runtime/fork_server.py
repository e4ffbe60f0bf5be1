"""A group's processes forked from one preloaded interpreter (``processes.preload``).

A split learner's training and serving processes, and a replica group's workers, are each
``python -m livefit ...`` importing TensorFlow, Keras and livefit before doing anything else:
some 3 s of one core each, paid again by every restart, with a private copy of what was
imported in each process. Like gunicorn's ``--preload``, the group's parent (which never
imports TensorFlow itself) starts one fork server that imports all of it once and then forks
each process of the group from itself: a process starts without the import, restarts in a
fraction of the time, and shares the imported pages with its siblings until it writes them.

The fork server imports only: TensorFlow's runtime, devices and pools are not started before the
fork (a fork after CUDA is initialised is unusable, and a pool's threads would be missing in the
child), so each child lists its devices and sizes its pools as a fresh process does
(``tests/e2e/test_preloaded_group.py`` checks that the imports start no runtime). The child
becomes what ``python -m livefit ARGS`` would be: its own process group, the parent-death
signal, stdin from /dev/null, the descriptors it was given at the numbers asked for, the
launcher's environment and working directory, a process name saying its role
(``name_process``), ``livefit``'s ``__main__`` run as the main module, and Python's own exit.
Its parent is the fork server, which reaps it and sends its exit status to the launcher:
``ForkedChild`` is a ``subprocess.Popen`` whose ``poll`` and ``wait`` read it; signals go to
the real pid.

It forks for its parent alone: a launch from any other process (``SO_PEERCRED``) is refused,
as is one that does not parse (``LaunchRequest``), since it runs whatever it is asked; its
socket lies in the group's 0700 directory besides.

Death follows the parents: the fork server dies with the group's parent (SIGKILL included) and
each child with the fork server, so no process outlives a killed parent. The fork server holds
SIGTERM, SIGINT and SIGHUP blocked (a stop that reaches every process, as systemd's does, stops
the children gracefully, not through their fork server's death); the parent kills it once its
children have stopped. A fork server that
dies takes its children with it; the group sees them exit and starts them again from a new fork
server. One that does not answer a launch within ``LAUNCH_TIMEOUT_S`` (stopped, wedged) is left
to the children it has (a child that exits unreaped is read from ``/proc`` after
``UNREAPED_GRACE_S``: a stopped fork server reaps nobody), the process it did not answer starts
fresh (``children.start_child``), and the next launch starts a new fork server. A launch it
answers with an error (the system refused the fork) starts fresh too, and fails as ``Popen``
would. All of them start fresh with ``processes.preload = false``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import logging
import os
import pkgutil
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..base.logs import configure_logging, current_logging, process_label
from .children import die_with_parent, prctl, start_child, stat_fields

log = logging.getLogger(__name__)

SOCKET_NAME = "fork.sock"  # with BINDING_SUFFIX within group_directory's Unix socket budget
BINDING_SUFFIX = ".b"  # bound under this name, renamed once it listens
# The packages a livefit server imports before it is ready (the rest of its imports are small)
PRELOADED = ("livefit.server", "livefit.models")
START_TIMEOUT_S = 120.0  # the imports, on a slow or loaded machine
LAUNCH_TIMEOUT_S = 30.0
UNREAPED_GRACE_S = 2.0  # a fork server reaps within milliseconds
MAX_REQUEST_BYTES = 1 << 20
_PR_SET_NAME = 15
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_HIGH_FD = 100  # received descriptors are moved here before they are put at their numbers


def preload() -> None:
    """Import what a livefit server imports, as it does (TensorFlow first, quietly), without
    touching a device."""
    from ..base import tensorflow_start

    tensorflow_start.quiet_tensorflow_env()
    with tensorflow_start.filtered_stderr():
        import tensorflow  # noqa: F401
    for package in PRELOADED:
        root = importlib.import_module(package)
        for module in pkgutil.walk_packages(root.__path__, f"{package}."):
            importlib.import_module(module.name)


# Process names (``/proc/PID/comm``): the fork server, a training process, a serving one + index
FORK_SERVER_NAME, TRAINING_NAME, SERVING_PREFIX = "livefit-fork", "livefit-train", "livefit-w"


def name_process() -> None:
    """Name this process after its role in a group: ``livefit-train`` for a split learner's
    training process, ``livefit-w0``, ``livefit-w1``... for serving processes (what
    ``ps -o comm`` and ``top`` show: a forked child's command line is its fork server's);
    nothing for a process on its own."""
    label = process_label()
    if label is not None:
        set_process_name(TRAINING_NAME if label == "training" else f"{SERVING_PREFIX}{label}")


def set_process_name(name: str) -> None:
    """This process's name (``/proc/PID/comm``, 15 bytes kept), where Linux's ``prctl`` is
    available."""
    call = prctl()
    if call is not None:
        call(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


# ---- the fork server (``python -m livefit.server.runtime.fork_server SOCKET``) ----


def hold_stop_signals() -> set[int | signal.Signals]:
    """Block the stop signals in this thread and every thread it starts after; the mask
    before, which each child puts back once it is set up (``serve``). Called before anything
    is imported: TensorFlow's import starts a native thread, which would otherwise take a
    SIGTERM sent to the process and end it (its default action)."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def serve(path: str, unblocked: set[int | signal.Signals]) -> tuple[LaunchRequest, list[int]]:
    """Fork a child for each request on the Unix socket ``path`` until this process is
    killed; returns only in a child, with its request and the descriptors it came with.

    The stop signals are held blocked (``hold_stop_signals``), and set back to ``unblocked``
    in each child once it is set up: systemd's stop sends SIGTERM to every process of the
    service at once, and a fork server ended by it would take its children down with SIGKILL
    before they stopped gracefully; a child keeps a stop sent to it before it was set up
    (pending), where an ignored one would be lost.

    A launch that cannot be read from the parent, or a ``fork`` the system refuses, is
    answered ``error ...`` (the launcher starts that process fresh, or fails as ``Popen``
    would); one from any other process is closed unanswered. Nothing a launch does ends the
    fork server: its children would die with it."""
    dies_with_this = die_with_parent()  # made here: it names this process as the parent
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}{BINDING_SUFFIX}")
    listener.listen(64)
    os.rename(f"{path}{BINDING_SUFFIX}", path)  # the path appears once connections are accepted
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    waiting: dict[int, socket.socket] = {}  # child pid -> the launcher's connection
    watched: list[Any] = [listener, woken]
    while True:
        readable, _, _ = select.select(watched, [], [])
        if woken in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 4096)
            _reap(waiting)
        if listener not in readable:
            continue
        try:
            connection, _ = listener.accept()
        except OSError as exc:  # out of descriptors: the launcher's wait times out
            log.warning("fork server: a launch not accepted: %s", exc)
            time.sleep(0.1)
            continue
        try:
            request, fds = _read_request(connection)
        except NotTheParent as exc:
            log.warning("fork server: a launch refused: %s", exc)
            connection.close()
            continue
        except (OSError, ValueError) as exc:  # a launcher that died mid-request, a bad one
            _answer(connection, f"error {exc}")
            continue
        try:
            pid = os.fork()
        except OSError as exc:  # a limit on processes or memory: as Popen would raise it
            for fd in fds:
                os.close(fd)
            _answer(connection, f"error fork: {exc}")
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for held in (listener, connection, *waiting.values()):
                held.close()
            os.close(woken)
            os.close(wake)
            become(request, fds, dies_with_this)
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)  # a pending stop acts now
            return request, fds
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            connection.sendall(f"{pid}\n".encode())
        waiting[pid] = connection
        _reap(waiting)  # a child may have ended before it was in ``waiting``


def _answer(connection: socket.socket, line: str) -> None:
    """Send ``line`` (one line, at most 1,000 characters) and close ``connection``."""
    with contextlib.suppress(OSError):
        connection.sendall(line.replace("\n", " ")[:1000].encode() + b"\n")
    connection.close()


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


class NotTheParent(ValueError):
    """A launch asked by another process than the fork server's parent."""


class LaunchRequest(BaseModel):
    """What a launcher asks the fork server for: ``python -m livefit ARGS`` with this
    environment and working directory, each descriptor sent with the request put at the
    numbers of its entry of ``fds``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    args: list[str]
    env: dict[str, str]
    cwd: str | None = None
    fds: list[list[Annotated[int, Field(ge=0, le=_HIGH_FD - 1)]]] = []


def _peer_pid(connection: socket.socket) -> int:
    """The pid of the process that connected (``SO_PEERCRED``)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))  # fmt: skip
    pid, _, _ = struct.unpack("3i", credentials)
    return int(pid)


def _read_request(connection: socket.socket) -> tuple[LaunchRequest, list[int]]:
    """The request on ``connection`` and the descriptors that came with it; raises
    ``OSError`` or ``ValueError`` (its descriptors closed) for one from any process but this
    one's parent, or one that does not parse."""
    connection.settimeout(LAUNCH_TIMEOUT_S)
    peer = _peer_pid(connection)
    if peer != os.getppid():  # the group's parent alone forks through it
        raise NotTheParent(f"a launch from pid {peer}, not from the parent")
    data, fds, _, _ = socket.recv_fds(connection, 65536, 16)
    try:
        while not data.endswith(b"\n") and len(data) < MAX_REQUEST_BYTES:
            more = connection.recv(65536)
            if not more:
                break
            data += more
        request = LaunchRequest.model_validate_json(data)
        if len(request.fds) != len(fds):
            raise ValueError(f"{len(fds)} descriptors for {len(request.fds)} places")
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise
    return request, list(fds)


def become(
    request: LaunchRequest, fds: Sequence[int], dies_with_parent: Callable[[], None] | None
) -> None:
    """In the child: what ``start_child`` and ``python -m livefit`` would have set up. Each
    descriptor of ``fds`` goes to the numbers ``request.fds`` lists for it."""
    os.setpgid(0, 0)
    os.environ.clear()
    os.environ.update(request.env)
    if request.cwd:
        os.chdir(request.cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD) for fd in fds]  # out of the targets' way
    for fd in fds:
        os.close(fd)
    for fd, targets in zip(moved, request.fds, strict=True):
        for target in targets:
            os.dup2(fd, target)  # inheritable, as ``pass_fds`` makes them
        os.close(fd)
    with contextlib.suppress(OSError):  # a working directory since removed: none, as Python
        sys.path[0] = os.getcwd()  # ``-m`` puts the working directory first
    tempfile.tempdir = None  # found again from TMPDIR, as a fresh process finds it
    time.tzset()  # likewise the time zone from TZ
    sys.argv = ["livefit", *request.args]
    if dies_with_parent is not None:
        dies_with_parent()  # (named after its role by livefit's main, as a fresh one is)
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator anew
        import numpy as np

        np.random.seed()


def main(argv: Sequence[str]) -> None:
    """``SOCKET [--log-level NUMBER] [--log-json]``: the group's parent passes its own
    logging, so that the fork server's few lines read as the rest of the group's."""
    import argparse
    import runpy

    unblocked = hold_stop_signals()
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("socket")
    parser.add_argument("--log-level", type=int, default=logging.INFO)
    parser.add_argument("--log-json", action="store_true")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_json)
    global log  # run by ``-m``, this module is ``__main__``: its lines under its own name
    log = logging.getLogger(__spec__.name if __spec__ is not None else __name__)
    set_process_name(FORK_SERVER_NAME)
    preload()
    gc.freeze()  # the collector leaves what was imported alone: its pages stay shared longer
    serve(args.socket, unblocked)
    runpy.run_module("livefit", run_name="__main__", alter_sys=True)


# ---- the launcher, in the group's parent ----


class ForkedChild(subprocess.Popen[bytes]):
    """A child of the fork server as a ``Popen``: ``pid`` is the real one (signals go to it);
    ``poll`` and ``wait`` read the exit status the fork server sends when it reaps the child
    (-9, SIGKILL, if the fork server itself is gone: its children die with it)."""

    def __init__(
        self, pid: int, connection: socket.socket, args: Sequence[str], received: bytes = b""
    ) -> None:
        # Popen's own __init__ starts a process: only the attributes its other methods read
        self.args = list(args)
        self.pid = pid
        self.returncode: Any = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # nothing for Popen.__del__ to reap
        self._connection = connection
        self._received = received  # what came after the pid in the launch's answer
        self._reading = threading.Lock()  # a stop in one thread, a poll in another
        self._zombie_since: float | None = None

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
        self._connection.close()

    def _read_unreaped(self) -> None:
        """The status of a child that exited and that its fork server has not reaped for
        ``UNREAPED_GRACE_S`` (a stopped fork server reaps nobody), read from the kernel: the
        group then learns of the death, and restarts it, as it does of any other. (An
        unreaped child's pid is not reused: this is always that child.)"""
        try:
            fields = stat_fields(self.pid)
        except OSError:
            return
        if fields[0] != "Z":
            self._zombie_since = None
            return
        now = time.monotonic()
        if self._zombie_since is None:
            self._zombie_since = now
        elif now - self._zombie_since >= UNREAPED_GRACE_S:
            self.returncode = os.waitstatus_to_exitcode(int(fields[52 - 3]))  # exit_code

    def _read_status(self, timeout: float) -> None:
        if self.returncode is None and b"\n" not in self._received:
            readable, _, _ = select.select([self._connection], [], [], timeout)
            if not readable:
                self._read_unreaped()
            else:
                try:
                    chunk = self._connection.recv(4096)
                except OSError:
                    chunk = b""
                self._received += chunk
                if not chunk and b"\n" not in self._received:
                    self.returncode = -signal.SIGKILL
        if self.returncode is None and b"\n" in self._received:
            self.returncode = int(self._received.split(b"\n")[0].split()[1])
        if self.returncode is not None:
            self._connection.close()


class ForkServerGone(RuntimeError):
    """The fork server could not start, or did not answer a launch."""


class LaunchRefused(OSError):
    """The fork server answered a launch with an error (its ``fork`` refused, a request it
    could not read): as ``Popen`` raises ``OSError`` when it cannot start a process."""


class ForkServer:
    """The fork server of one group, its socket in the group's ``directory``, started on
    the first launch and again after it died."""

    def __init__(self, directory: Path, env: Mapping[str, str] | None = None) -> None:
        self.socket_path = str(directory / SOCKET_NAME)
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen[bytes] | None = None
        self.abandoned: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start the fork server and wait until it listens (its imports done)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        level, json_format = current_logging()
        command = [sys.executable, "-m", __name__, self.socket_path, "--log-level", str(level)]
        command += ["--log-json"] if json_format else []
        self.process = start_child(command, env=self.env)
        log.info("fork server started (pid %d): preloading TensorFlow and livefit for the "
                 "group's processes", self.process.pid)  # fmt: skip
        if not listens(self.process, self.socket_path, START_TIMEOUT_S):
            code = self.process.poll()
            self._kill(self.process)  # not the abandoned ones: their children run on
            self.process = None
            raise ForkServerGone(f"the fork server did not start (status {code})")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def abandon(self) -> None:
        """Leave the fork server that did not answer (stopped, wedged) to its children, which
        run on (one that exits unreaped is seen all the same: ``ForkedChild``); the next
        launch starts another. ``stop`` kills both."""
        if self.process is not None:
            self.abandoned.append(self.process)
            self.process = None

    def stop(self) -> None:
        """SIGKILL the fork servers (and so any child of theirs still running)."""
        for process in [*self.abandoned, *([self.process] if self.process else [])]:
            self._kill(process)
        self.process, self.abandoned = None, []

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)

    def launch(
        self, argv: Sequence[str], env: Mapping[str, str], fds: Mapping[int, Sequence[int]] = {}
    ) -> ForkedChild:
        """``python -m livefit ARGS`` (``argv``) forked from the fork server, started first
        if it is not running, with this process's descriptor ``fd`` at the child's numbers
        ``fds[fd]``. Raises ``ForkServerGone`` when it cannot start or does not answer."""
        if not self.running():
            self.start()
        try:
            cwd: str | None = os.getcwd()
        except OSError:  # removed since: the child starts where the fork server is
            cwd = None
        return request_fork(self.socket_path, argv, env, cwd, fds)


def listens(process: subprocess.Popen[bytes], socket_path: str, timeout_s: float) -> bool:
    """Wait until the fork server ``process`` listens on ``socket_path`` (its imports done);
    False if it exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def request_fork(
    socket_path: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
    fds: Mapping[int, Sequence[int]],
) -> ForkedChild:  # fmt: skip
    """Ask the fork server listening on ``socket_path`` for ``python -m livefit ARGS``
    (``argv``) with ``env``, in ``cwd`` (None: its own), this process's descriptor ``fd`` at
    the child's numbers ``fds[fd]``. Raises ``LaunchRefused`` when it answers that it could
    not, ``ForkServerGone`` when it does not answer."""
    sent = list(fds)
    request = {"args": list(argv[3:]), "env": dict(env), "cwd": cwd,
               "fds": [list(fds[fd]) for fd in sent]}  # fmt: skip
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(LAUNCH_TIMEOUT_S)
    try:
        connection.connect(socket_path)
        socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], sent)
        answer = b""
        while b"\n" not in answer:
            chunk = connection.recv(64)
            if not chunk:
                raise OSError("the fork server closed the connection without a pid")
            answer += chunk
        line, _, after = answer.partition(b"\n")  # a child that ended at once: its status too
        if line.startswith(b"error "):
            connection.close()
            raise LaunchRefused(line[6:].decode(errors="replace").strip())
        pid = int(line)
    except LaunchRefused:
        raise
    except (OSError, ValueError) as exc:
        connection.close()
        raise ForkServerGone(f"the fork server did not answer: {exc}") from exc
    connection.settimeout(None)
    return ForkedChild(pid, connection, argv, received=after)


class Launcher:
    """How a group starts its processes: forked from its fork server where ``preload`` and
    the command allow (``python -m livefit ...``), else fresh (``children.start_child``)."""

    def __init__(self, directory: Path, preload: bool) -> None:
        self.server = ForkServer(directory) if preload else None

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> subprocess.Popen[bytes]:
        if self.server is not None and list(argv[1:3]) == ["-m", "livefit"]:
            try:
                return self.server.launch(argv, env, {fd: [fd] for fd in pass_fds})
            except LaunchRefused as exc:
                log.warning("the fork server could not fork (%s); starting this process fresh",
                            exc)  # fmt: skip
            except ForkServerGone as exc:
                log.warning("%s; leaving it to its processes, starting this one fresh (the "
                            "next from a new fork server)", exc)  # fmt: skip
                self.server.abandon()
        return start_child(argv, env=env, pass_fds=tuple(pass_fds))

    def close(self) -> None:
        """Stop the fork server: after the processes it forked have stopped."""
        if self.server is not None:
            self.server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
