"""The signals that stop a livefit process gracefully: SIGTERM, SIGINT and SIGHUP.

SIGHUP is a graceful stop, as SIGTERM: livefit has nothing to reload (its configuration is read
once, at start), and a hangup (the terminal that started it closed, a supervisor's stop) must
not kill a learner without its last training, checkpoint and publish, as the default action
did. A process that starts with SIGHUP ignored (``nohup``, a detaching supervisor) keeps it
ignored, and so do the children it starts (an ignored signal stays ignored across exec).
Every livefit process that runs until stopped uses this: the ``livefit serve`` parent of a
split learner, its training process and serving processes, the one-process learner, ``livefit
replica`` (one process or a group) and the demo.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT, and SIGHUP unless this process ignores it (started under ``nohup``)."""
    hangup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hangup)


def on_stop_signals(handler: Handler) -> dict[int, Any]:
    """Install ``handler`` for every stop signal (from the main thread); the handlers it
    replaced, by signal, to restore."""
    return {sig: signal.signal(sig, handler) for sig in stop_signals()}
