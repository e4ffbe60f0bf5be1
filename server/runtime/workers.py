"""``livefit replica --workers N``: N serving processes behind one port, supervised.

The parent binds the listening socket (so a taken port fails at once, as with one process),
then starts N copies of the same ``livefit replica`` command as children that inherit the
socket: the kernel hands each new connection to one of them (the pre-fork model of gunicorn
and nginx). Each worker is a whole replica (its own weight stream subscription and MQTT client
id, its own batcher), on its own GIL. ``/metrics`` on any worker answers for all of them
(``server/base/metrics_merge.py``).

Lifecycle promises:
- SIGTERM, SIGINT or SIGHUP (``stop_signals.py``) to the parent stops every worker
  gracefully (each drains its requests) and the parent exits 0 when they all did;
- a worker that dies after it started serving is started again (also when its replacement
  dies while starting); one whose slot never served (a bad key, an unreachable broker
  refusing it) stops the group, and the parent exits with that worker's status and its
  reason in the log; so does one that dies more than ``MAX_RESTARTS`` times in
  ``RESTART_WINDOW_S``;
- a worker that served and whose event loop then stays silent for ``http.worker_timeout_s``
  (SIGSTOPped, wedged) is SIGKILLed, and so started again (``server/base/heartbeat.py``);
- no worker outlives its parent, even a SIGKILLed one (``server/runtime/children.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..base.heartbeat import Silence, beat_file
from ..base.logs import WORKER_ENV
from .children import stop_children
from .fork_server import Launcher
from .group_directory import group_directory, release_group_directory
from .listening import StartupError, bind_socket
from .stop_signals import on_stop_signals

log = logging.getLogger(__name__)
_INDEX, _COUNT, _FD, _DIR, _KIND = (
    WORKER_ENV, "LIVEFIT_WORKER_COUNT", "LIVEFIT_LISTEN_FD", "LIVEFIT_WORKER_DIR",
    "LIVEFIT_GROUP_KIND",
)  # fmt: skip
TRAINING = "training"  # a split learner's training process: its metrics label and marker name
MAX_RESTARTS, RESTART_WINDOW_S = 5, 300.0
STOP_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Who a worker process is: its index of ``count``, the inherited listening socket's
    descriptor, the group's private directory (metrics sockets, a learner's weight feed) and
    whether the group is a replica's (``"replica"``) or a split learner's (``"learner"``)."""

    index: int
    count: int
    listen_fd: int
    directory: Path
    kind: str = "replica"

    @classmethod
    def from_env(cls) -> WorkerSlot | None:
        """This process's slot when a worker group started it, else None."""
        if _INDEX not in os.environ:
            return None
        return cls(
            int(os.environ[_INDEX]), int(os.environ[_COUNT]), int(os.environ[_FD]),
            Path(os.environ[_DIR]), os.environ.get(_KIND, "replica"),
        )  # fmt: skip

    def env(self) -> dict[str, str]:
        """The environment variables that make a child this slot's worker."""
        return {_INDEX: str(self.index), _COUNT: str(self.count), _FD: str(self.listen_fd),
                _DIR: str(self.directory), _KIND: self.kind}  # fmt: skip

    def peers(self) -> list[str]:
        """The metrics labels of every process of the group."""
        found = [str(i) for i in range(self.count)]
        return [*found, TRAINING] if self.kind == "learner" else found

    def listening_socket(self) -> socket.socket:
        return socket.socket(fileno=self.listen_fd)

    def started_marker(self) -> Path:
        """Exists once this worker serves (its metrics socket)."""
        return self.directory / f"{self.index}.sock"

    def heartbeat_file(self) -> Path:
        """Touched every second by this worker's event loop (``heartbeat``)."""
        return beat_file(self.directory, self.index)


@dataclass(slots=True)
class GroupMember:
    """One supervised process of a group: its slot, the running process, its recent restarts,
    whether it got ready (served) since it last started, and whether this slot ever did."""

    slot: WorkerSlot
    process: subprocess.Popen[bytes] | None = None
    restarts: deque[float] = field(default_factory=deque)
    served: bool = False  # the running process got ready
    ever_served: bool = False  # some process of this slot got ready since the group started
    silence: Silence = field(default_factory=Silence)  # of the running process's heartbeat

    def mark_served(self, ready: bool) -> None:
        self.served = self.served or ready
        self.ever_served = self.ever_served or self.served

    def dies_fatally(self) -> bool:
        """A death that ends the group at once: a slot that never got ready (a bad key, a
        refusing broker). A restarted process that dies while it starts (a second OOM kill)
        counts towards ``MAX_RESTARTS`` like any other death of a slot that once served."""
        return not self.ever_served


def restarts_in_window(restarts: deque[float], now: float) -> int:
    """Record a restart at ``now``; how many fall within ``RESTART_WINDOW_S``."""
    restarts.append(now)
    while restarts and restarts[0] < now - RESTART_WINDOW_S:
        restarts.popleft()
    return len(restarts)


class WorkerGroup:
    """Starts and supervises the workers running ``argv`` (a ``livefit replica`` command, or
    ``livefit serve`` for a split learner's serving processes: ``kind="learner"``)."""

    def __init__(
        self, argv: Sequence[str], count: int, sock: socket.socket, kind: str = "replica",
        hang_timeout_s: float = 0.0, preload: bool = True,
    ) -> None:  # fmt: skip
        """``hang_timeout_s``: kill a worker that served and then stayed silent this long
        (``http.worker_timeout_s``; 0: never); ``preload``: fork the processes from the
        group's fork server (``processes.preload``, ``fork_server.py``)."""
        self.argv = list(argv)
        self.sock = sock
        self.hang_timeout_s = hang_timeout_s
        self.directory = group_directory()
        self.launcher = Launcher(self.directory, preload)
        self.workers = [
            GroupMember(WorkerSlot(i, count, sock.fileno(), self.directory, kind))
            for i in range(count)
        ]
        self.stopping = threading.Event()

    def start(self, worker: GroupMember) -> None:
        slot = worker.slot
        env = {**os.environ, **slot.env()}
        worker.process = self.launcher.start(self.argv, env, pass_fds=(slot.listen_fd,))
        log.info("serving worker %d started (pid %d)", slot.index, worker.process.pid)

    def run(self) -> int:
        """Start every worker and supervise them until stopped; the exit status."""
        try:
            status = self._start_all()
            if status is not None:
                return status
            while not self.stopping.wait(0.2):
                status = self._check()
                if status is not None:
                    return status
            return self._stop()
        finally:
            self._stop()
            self.launcher.close()  # after its children stopped: they die with it
            release_group_directory(self.directory)

    def close(self) -> None:
        """Release what the group holds beside its processes (nothing here)."""

    def _start_all(self) -> int | None:
        """Start every process of the group; an exit status when the group cannot start."""
        for worker in self.workers:
            self.start(worker)
        return None

    def _check(self) -> int | None:
        """Restart workers that died after serving; the group's exit status when it must end."""
        for worker in self.workers:
            assert worker.process is not None
            worker.mark_served(worker.slot.started_marker().exists())
            code = worker.process.poll()
            if code is None:
                label = f"serving worker {worker.slot.index}"
                self._kill_if_silent(worker, worker.slot.heartbeat_file(), label)
                continue
            index = worker.slot.index
            if worker.dies_fatally():
                log.error("serving worker %d exited with status %d before it served; stopping "
                          "(its log lines above say why)", index, code)  # fmt: skip
                return code or 1
            if restarts_in_window(worker.restarts, time.monotonic()) > MAX_RESTARTS:
                log.error("serving worker %d died %d times in %.0f s (last status %d); stopping",
                          index, len(worker.restarts), RESTART_WINDOW_S, code)  # fmt: skip
                return 1
            log.warning("serving worker %d exited with status %d; starting it again", index, code)
            worker.served = False
            worker.slot.started_marker().unlink(missing_ok=True)
            worker.slot.heartbeat_file().unlink(missing_ok=True)
            worker.silence = Silence()
            self.start(worker)
        return None

    def _kill_if_silent(
        self, member: GroupMember, beat: Path, name: str, now: float | None = None
    ) -> None:
        """SIGKILL a running process of the group (``name`` in the log) that was ready and has
        not touched ``beat`` for ``hang_timeout_s`` (stopped or wedged: a serving process's
        connections would wait forever); the next check restarts it. ``now``: this check's
        ``time.monotonic()`` (tests)."""
        if not self.hang_timeout_s or not member.served or member.process is None:
            return
        silent = member.silence.observe(beat, now)
        if silent <= self.hang_timeout_s:
            return
        log.error(
            "%s (pid %d) has not run for %.0f s (stopped or hung; http.worker_timeout_s = %g); "
            "killing it", name, member.process.pid, silent, self.hang_timeout_s,
        )  # fmt: skip
        member.process.kill()

    def _stop(self) -> int:
        """SIGTERM every worker, SIGKILL those left after ``STOP_GRACE_S``; 0 if all stopped."""
        children = [w.process for w in self.workers if w.process is not None]
        stop_saying(children, STOP_GRACE_S, f"the serving processes ({len(children)})",
                    "to answer the requests they hold")  # fmt: skip
        # A worker still starting when SIGTERM came dies of it (-15) before uvicorn handles
        # it: stopped on request all the same. SIGKILL after the grace period is not clean.
        codes = [child.returncode for child in children]
        return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1


def stop_saying(
    children: Sequence[subprocess.Popen[bytes]], grace_s: float, who: str, why: str
) -> None:
    """``stop_children``, saying in the log whom the stop waits for and why, then how long
    (nothing when none is running)."""
    running = [child for child in children if child.poll() is None]
    if not running:
        return
    log.info("stopping: waiting up to %.0f s for %s %s", grace_s, who, why)
    started = time.monotonic()
    stop_children(running, grace_s)
    codes = ", ".join(str(child.returncode) for child in running)
    log.info("%s exited after %.1f s (status %s)", who, time.monotonic() - started, codes)


def run_workers(
    argv: Sequence[str], count: int, host: str, port: int, hang_timeout_s: float = 0.0,
    preload: bool = True,
) -> int:  # fmt: skip
    """Bind ``host:port``, run ``count`` workers of ``argv`` until SIGINT or SIGTERM (a
    worker silent for ``hang_timeout_s`` is killed and started again; 0: never), forked from
    a fork server where ``preload``."""

    def make(sock: socket.socket) -> WorkerGroup:
        return WorkerGroup(argv, count, sock, hang_timeout_s=hang_timeout_s, preload=preload)

    return run_group(make, host, port, f"{count} serving workers")


def run_group(
    make: Callable[[socket.socket], WorkerGroup], host: str, port: int, describe: str
) -> int:
    """Bind ``host:port`` (status 2 at once when taken), run the group ``make`` builds on that
    socket until SIGINT or SIGTERM; the group's exit status. ``describe`` names it in logs."""
    try:
        sock = bind_socket(host, port)
    except StartupError as exc:
        print(f"livefit: {exc}", file=sys.stderr)
        return 2
    try:
        group = make(sock)
    except StartupError as exc:
        sock.close()
        print(f"livefit: {exc}", file=sys.stderr)
        return 2
    bound = sock.getsockname()
    log.info("%s on %s:%d", describe, bound[0], bound[1])

    def stop(signum: int, _frame: object) -> None:
        log.info("%s: stopping %s", signal.Signals(signum).name, describe)
        group.stopping.set()

    on_stop_signals(stop)  # SIGTERM, SIGINT, SIGHUP (stop_signals.py)
    try:
        return group.run()
    finally:
        group.close()
        sock.close()
