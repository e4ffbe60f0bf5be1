"""Child processes livefit starts itself (a mosquitto for ``serve`` or the demo, the demo's
learner and replica): they die with the process that started them, and stop in order.

Two promises, whatever way the parent ends:
- a child gets SIGKILL from the kernel when its parent dies, SIGKILL of the parent included
  (Linux's ``PR_SET_PDEATHSIG``; elsewhere a child outlives a killed parent, as any would),
  and not before: Linux ties that signal to the THREAD that forked the child, not to the
  process, so every child is forked by a thread that lives as long as the process (the main
  thread, or the spawner thread that forks for every other; see ``start_child``). A mosquitto
  forked by the split learner's short-lived start thread was SIGKILLed the moment that thread
  ended, and ``livefit serve`` with ``broker.url = "auto"`` could not start its own broker;
- a child runs in its own process group, so the terminal's Ctrl-C reaches only the parent,
  which stops its children itself, in its own order (a learner publishes its last weights
  before its broker goes).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` from the third (the state) on: ``[0]`` is field 3;
    the command name before them may hold spaces and parentheses, so they start after its
    last ")". Raises ``OSError`` (``FileNotFoundError``: no such process, or no /proc)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 :].decode().split()


@functools.cache
def prctl() -> Callable[..., int] | None:
    """Linux's ``prctl``, from this process's own symbols (libc's), looked up once; None
    elsewhere. ``ctypes.util.find_library`` would run ``ldconfig`` at every child's start."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the kernel SIGKILL the child when this process dies; None
    where that is not available."""
    call = prctl()
    if call is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        call(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _Spawner:
    """A daemon thread that forks the children other threads than the main one start: it lives
    as long as the process (it only waits for work), so the kernel's parent-death signal,
    which follows the forking thread, comes when the process dies and not before."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._run, name="livefit-spawner", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            call, result = self.requests.get()
            try:
                result.set_result(call())
            except BaseException as exc:  # handed to the thread that asked
                result.set_exception(exc)

    def run(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the spawner thread; what it returned or raised."""
        result: Future[Any] = Future()
        self.requests.put((call, result))
        return result.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def start_spawner() -> None:
    """Start the thread that forks children for threads other than the main one, now (it
    starts on first use otherwise). A new thread takes its creator's scheduling priority, and
    a forked child the forking thread's: the split learner's training process calls this
    before it lowers its training threads' priority, so that a broker it starts is not
    lowered with them."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():  # none yet, or one of a parent
            _spawner = _Spawner()


def spawner_thread() -> threading.Thread:
    """The thread that forks children for threads other than the main one (started now if it
    has not started): the split learner's training process leaves it on every CPU when it pins
    its other threads to the training cores, so that a broker it starts is not pinned."""
    start_spawner()
    assert _spawner is not None
    return _spawner.thread


def _forking_thread() -> _Spawner | None:
    """Who must fork a child for the calling thread: None for the main thread (it lives as
    long as the process) and the spawner thread itself, else the spawner."""
    current = threading.current_thread()
    if current is threading.main_thread():
        return None
    start_spawner()
    assert _spawner is not None
    return None if current is _spawner.thread else _spawner


def start_child(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen)`` in its own process group, dying with this process
    (and only with it: forked by a thread that lives as long as the process, whichever thread
    calls); stdin is closed unless given."""
    popen.setdefault("stdin", subprocess.DEVNULL)

    def fork() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv), preexec_fn=die_with_parent(), process_group=0, **popen
        )  # fmt: skip

    spawner = _forking_thread()
    child: subprocess.Popen[bytes] = fork() if spawner is None else spawner.run(fork)
    return child


def stop_children(children: Sequence[subprocess.Popen[Any]], grace_s: float) -> None:
    """SIGTERM to every child still running, SIGKILL to those left after ``grace_s``."""
    running = [child for child in children if child.poll() is None]
    for child in running:
        with contextlib.suppress(OSError):
            child.terminate()
    deadline = time.monotonic() + max(grace_s, 0.0)
    for child in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(max(0.0, deadline - time.monotonic()))
        if child.poll() is None:
            log.warning("pid %d still running %.0f s after SIGTERM; sending SIGKILL",
                        child.pid, grace_s)  # fmt: skip
            with contextlib.suppress(OSError):
                child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(5)
