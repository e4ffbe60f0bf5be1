"""Noticing the storage directory deleted or replaced under a running learner.

``rm -rf`` of ``storage.dir`` while the learner runs used to go unnoticed by ingestion: groups
were written and fsynced into the unlinked log segment and acknowledged, and were gone at the
next start; and since the storage lock was on a deleted file, a second learner could start on
the same path. Every ``interval_s`` ``StorageWatch`` checks that the lock file at the path is
still the one locked (``StorageLock.lost``). The first time it is not, the storage is lost for
good for this process:

- the write-ahead log is told (``on_lost``): it refuses every later group (``storage_lost``),
  so nothing more is acknowledged and the broker keeps the rest for redelivery (the log's own
  check of its segment's link count and directory identity at every commit catches a deletion
  between two checks here);
- ``storage_lost`` fails in ``StorageHealth`` and never recovers: readiness 503 naming it,
  ``livefit_storage_healthy`` 0, until the learner is restarted;
- the lock is taken again on the path, the directory recreated for it (``retake``), so a second
  learner there is still refused, naming this one, while it runs. Nothing else is written there:
  what the deleted directory held is gone, and whether that was an accident or a wipe is for a
  restart to settle (it starts from what is there then; the broker redelivers what was not
  acknowledged). Should another process take the path first (within ``interval_s`` of the
  deletion), this learner says so and keeps refusing writes.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable

from .health import StorageHealth
from .lock import StorageLock, StorageLocked

log = logging.getLogger(__name__)
STORAGE_CHECK_INTERVAL_S = 1.0


class StorageWatch:
    """A thread checking, every ``interval_s``, that the storage lock still proves ownership."""

    def __init__(
        self,
        lock: StorageLock,
        health: StorageHealth,
        on_lost: Callable[[str], None],
        interval_s: float = STORAGE_CHECK_INTERVAL_S,
    ) -> None:
        self.lock = lock
        self.health = health
        self.on_lost = on_lost
        self.interval_s = interval_s
        self.lost: str | None = None  # the first reason found (the storage stays lost)
        self._refused: str | None = None  # why the last retake failed (logged once each)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="storage-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # a bug must not end the watch
                log.exception("storage check failed")

    def check(self) -> None:
        """One check: report a lost lock, and lock the path again while this one is not held."""
        reason = self.lock.lost()
        if reason is None and (self.lost is None or self.lock.held):
            return
        if reason is not None and self.lost is None:
            self.lost = reason
            self.health.failed("storage_lost", FileNotFoundError(errno.ENOENT, reason))
            self.on_lost(reason)
        try:
            self.lock.retake()
        except StorageLocked as exc:
            if str(exc) != self._refused:
                self._refused = str(exc)
                log.error("storage: cannot lock %s again: %s", self.lock.directory, exc)
            return
        self._refused = None
        log.error(
            "storage: %s; locked %s again so that no second learner starts there while this "
            "one runs; nothing more is written or acknowledged until this learner is restarted",
            reason or "the storage lock was lost", self.lock.directory,
        )  # fmt: skip
