"""The storage lock and its watch when the storage dir is deleted or replaced while held."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.storage.health import StorageHealth
from livefit.server.storage.lock import StorageLock, StorageLocked
from livefit.server.storage.metrics import StorageMetrics
from livefit.server.storage.watch import StorageWatch


def test_a_deleted_lock_file_is_lost_and_taken_again(tmp_path: Path) -> None:
    storage = tmp_path / "data"
    lock = StorageLock(storage).acquire(http_port=1234)
    assert lock.lost() is None
    shutil.rmtree(storage)
    assert "deleted" in str(lock.lost())  # another learner would lock a new file there
    lock.retake()
    assert lock.lost() is None
    with pytest.raises(StorageLocked, match="HTTP port 1234"):
        StorageLock(storage).acquire()
    storage.rename(tmp_path / "moved")  # the held file still has a name, elsewhere
    assert "gone" in str(lock.lost())
    StorageLock(storage).acquire().release()
    assert "replaced" in str(lock.lost())
    lock.release()


def test_the_watch_reports_once_stops_the_log_and_keeps_the_path_locked(tmp_path: Path) -> None:
    storage = tmp_path / "data"
    metrics = Metrics()
    health = StorageHealth(metrics)
    lost: list[str] = []
    lock = StorageLock(storage).acquire()
    watch = StorageWatch(lock, health, lost.append)
    watch.check()
    assert health.healthy and not lost
    shutil.rmtree(storage)
    watch.check()
    watch.check()
    assert len(lost) == 1 and "storage_lost" in health.problems()[0]
    assert metrics.group(StorageMetrics).storage_healthy._value.get() == 0
    with pytest.raises(StorageLocked, match="in use by another livefit learner"):
        StorageLock(storage).acquire()
    shutil.rmtree(storage)  # deleted again: locked again, still unhealthy, reported once
    watch.check()
    assert lock.lost() is None and len(lost) == 1 and not health.healthy
    lock.release()


def test_the_watch_keeps_trying_while_another_process_holds_the_path(tmp_path: Path) -> None:
    storage = tmp_path / "data"
    health = StorageHealth(Metrics())
    lock = StorageLock(storage).acquire()
    watch = StorageWatch(lock, health, lambda reason: None)
    shutil.rmtree(storage)
    other = StorageLock(storage).acquire()  # got there first
    watch.check()
    assert not lock.held and not health.healthy
    other.release()
    watch.check()
    assert lock.held and lock.lost() is None and not health.healthy
    lock.release()
