"""The demo's stop request: SIGINT, SIGTERM and SIGHUP set an event instead of raising
KeyboardInterrupt, so every part of the demo winds down and prints its summary; a second
signal kills the children (the ones registered in ``children``) at once. ``StopRequest`` is
the one object every part of the demo checks and waits on.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from livefit.server.runtime.local_process import LocalProcess
from livefit.server.runtime.stop_signals import on_stop_signals


class StopRequest:
    """Set by SIGINT/SIGTERM/SIGHUP instead of raising KeyboardInterrupt; a second signal kills
    the ``children`` at once. ``install`` takes the signals, ``restore`` gives them back."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self.children: list[LocalProcess] = []
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle the stop signals from now on (in the main thread)."""
        self._previous.update(on_stop_signals(self._handle))

    def restore(self) -> None:
        """Give the stop signals back to the handlers they had before ``install``."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.event.is_set():  # asked twice: no more waiting
            for child in self.children:
                child.kill()
            return
        self.signal = signum
        self.event.set()

    @property
    def requested(self) -> bool:
        """Whether a stop signal came."""
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until a stop signal comes; True if one came."""
        return self.event.wait(seconds)
