"""The version mark on disk (``VersionMark``): no snapshot leaves a trainer with a version the
mark does not cover.

A restart continues above the mark, so no version is ever handed out twice, even by a learner
killed long after its last checkpoint (versions may jump instead). Versions are claimed a block
(``VERSION_BLOCK``) at a time; while the mark cannot be written (a full disk) training goes on
but nothing above it leaves (readiness names ``version_mark``), and the write is tried again on a
back-off. After a clean stop the exact version is recorded, so that a restart continues right
there without a jump.
"""

from __future__ import annotations

from ..base.backoff import Backoff
from ..storage.checkpoint import CheckpointStore
from ..storage.health import StorageHealth

VERSION_BLOCK = 1000  # versions claimed on disk at a time (see VersionMark.claim)
# While storage fails, a checkpoint or a version mark is tried again after 1, 2, 4, 5, 5... s
STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S = 1.0, 5.0


class VersionMark:
    """The versions a trainer may hand out: up to ``claimed``, the mark on disk in ``store``
    (without a store, a new lineage per process: anything may leave)."""

    def __init__(self, store: CheckpointStore | None, storage: StorageHealth) -> None:
        self.store = store
        self.storage = storage
        self.claimed = 0  # the version mark on disk: no snapshot above it leaves
        self._retry = Backoff(STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S)

    def claim(self, version: int) -> bool:
        """Whether a snapshot at ``version`` may leave the trainer: the mark on disk covers it,
        claiming the next block (``VERSION_BLOCK``) there first when it does not. While the
        mark cannot be written the answer is no, tried again on a back-off."""
        if version <= self.claimed:
            return True
        if self.store is None:  # no storage: a new lineage per process, nothing to claim
            self.claimed = version + VERSION_BLOCK
            return True
        if not self._retry.due():
            return False
        try:
            self.store.write_high_water_mark(version + VERSION_BLOCK)
        except OSError as exc:
            self.storage.failed("version_mark", exc)
            self._retry.failed()
            return False
        self.claimed = version + VERSION_BLOCK
        self._retry.succeeded()
        self.storage.recovered("version_mark")
        return True

    def record_exact(self, version: int) -> bool:
        """After a clean stop whose checkpoint at ``version`` is on disk: mark exactly
        ``version``, so that a restart continues right here instead of above the claimed block.
        False where the mark cannot be written: the claimed one stays (a restart jumps, never
        reuses)."""
        if self.store is None:
            return False
        try:
            self.store.write_high_water_mark(version)
        except OSError as exc:
            self.storage.failed("version_mark", exc)
            return False
        self.claimed = version
        return True
