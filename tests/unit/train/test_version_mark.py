"""``VersionMark`` on a real checkpoint directory: versions are claimed a block at a time, none
leaves while the mark cannot be written (tried again on a back-off), and a clean stop marks the
exact version."""

from __future__ import annotations

import errno
import time
from pathlib import Path

from livefit.server.base.metrics import Metrics
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.storage.health import StorageHealth
from livefit.server.train.version_mark import STORAGE_RETRY_FIRST_S, VERSION_BLOCK, VersionMark


class FullDisk:
    """The store's mark writes fail as on a full disk while ``full`` is set; counts the tries."""

    def __init__(self, store: CheckpointStore) -> None:
        self.full = True
        self.tries = 0
        real = store.write_high_water_mark

        def write(version: int) -> None:
            self.tries += 1
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(version)

        store.write_high_water_mark = write  # type: ignore[method-assign]


def mark(directory: Path) -> tuple[VersionMark, CheckpointStore, StorageHealth]:
    store = CheckpointStore(directory, "m")
    storage = StorageHealth(Metrics())
    return VersionMark(store, storage), store, storage


def test_a_version_above_the_mark_claims_the_next_block_on_disk(tmp_path: Path) -> None:
    versions, store, _ = mark(tmp_path)
    assert versions.claim(0)  # covered by the mark of a new directory: nothing written
    assert store.high_water_mark() == 0
    assert versions.claim(1)
    assert store.high_water_mark() == versions.claimed == 1 + VERSION_BLOCK
    assert versions.claim(VERSION_BLOCK)  # inside the block: no new write
    assert store.high_water_mark() == 1 + VERSION_BLOCK
    assert versions.claim(2 + VERSION_BLOCK)
    assert store.high_water_mark() == 2 + 2 * VERSION_BLOCK


def test_without_storage_every_version_may_leave() -> None:
    versions = VersionMark(None, StorageHealth(Metrics()))
    assert versions.claim(5) and versions.claimed == 5 + VERSION_BLOCK
    assert not versions.record_exact(7)  # nowhere to record it
    assert versions.claimed == 5 + VERSION_BLOCK


def test_nothing_leaves_while_the_mark_cannot_be_written_and_it_is_retried(
    tmp_path: Path,
) -> None:
    versions, store, storage = mark(tmp_path)
    disk = FullDisk(store)
    assert not versions.claim(1)
    assert disk.tries == 1 and not storage.healthy
    assert any("version_mark" in problem for problem in storage.problems())
    assert not versions.claim(1)  # within the back-off: not even tried
    assert disk.tries == 1 and versions.claimed == 0
    assert versions.claim(0)  # what the mark covers still leaves
    disk.full = False
    time.sleep(STORAGE_RETRY_FIRST_S + 0.05)
    assert versions.claim(1)
    assert disk.tries == 2 and storage.healthy
    assert store.high_water_mark() == 1 + VERSION_BLOCK


def test_a_clean_stop_marks_the_exact_version(tmp_path: Path) -> None:
    versions, store, storage = mark(tmp_path)
    assert versions.claim(3)
    assert store.high_water_mark() == 3 + VERSION_BLOCK
    assert versions.record_exact(3)
    assert store.high_water_mark() == versions.claimed == 3
    disk = FullDisk(store)
    assert versions.claim(4) is False  # the next claim fails, and so does an exact mark
    assert not versions.record_exact(4)
    assert versions.claimed == 3 and store.high_water_mark() == 3  # a restart jumps, never reuses
    assert not storage.healthy and disk.tries == 2
