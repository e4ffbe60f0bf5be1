"""Child processes livefit starts itself (a mosquitto for ``serve`` or the demo, the demo's
learner and replica): they die with the process that started them, and stop in order.

Two promises, whatever way the parent ends:
- a child gets SIGKILL from the kernel when its parent dies, SIGKILL of the parent included
  (Linux's ``PR_SET_PDEATHSIG``; elsewhere a child outlives a killed parent, as any would);
- a child runs in its own process group, so the terminal's Ctrl-C reaches only the parent,
  which stops its children itself, in its own order (a learner publishes its last weights
  before its broker goes).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the kernel SIGKILL the child when this process dies; None
    where that is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def start_child(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen)`` in its own process group, dying with this process;
    stdin is closed unless given."""
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(
        list(argv), preexec_fn=die_with_parent(), process_group=0, **popen
    )  # fmt: skip


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
