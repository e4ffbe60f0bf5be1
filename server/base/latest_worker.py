"""A background thread that handles only the newest item offered ("newest wins").

Used where an older item is worthless once a newer one exists: snapshots to publish,
checkpoints to write. ``offer`` never blocks the caller (the trainer thread); an item offered
while an older one waits replaces it. With a ``ready`` predicate, items wait until it holds
(the broker connection is up) and only the newest goes out then. ``stop`` handles what is
pending (if ready) and joins.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
_POLL_S = 0.1


class LatestWorker(Generic[T]):
    """Calls ``handle(item)`` on its own thread for the newest item offered."""

    def __init__(
        self, name: str, handle: Callable[[T], None], ready: Callable[[], bool] | None = None
    ) -> None:
        self.name = name
        self.handle = handle
        self.ready = ready or (lambda: True)
        self._pending: T | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def offer(self, item: T) -> None:
        """Queue ``item`` in place of any older pending one; returns at once."""
        with self._wake:
            self._pending = item
            self._wake.notify()

    def stop(self, timeout: float = 30.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("%s did not stop within %.0fs", self.name, timeout)
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(
                    lambda: self._stopping or (self._pending is not None and self.ready()),
                    _POLL_S,
                )
                stopping, item = self._stopping, None
                if self._pending is not None and self.ready():
                    item, self._pending = self._pending, None
            if item is not None:
                self._handle_safely(item)
            if stopping:
                return

    def _handle_safely(self, item: T) -> None:
        try:
            self.handle(item)
        except Exception:
            log.exception("%s failed on an item; continuing", self.name)
