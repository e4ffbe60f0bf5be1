"""``Snapshots`` of a real step: the start's snapshot opens no interval, later ones wait for
``weights.serve_interval_s`` unless forced, a version is copied once, and a snapshot the version
mark does not cover is held back (the newest wins) until the mark is written."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.storage.health import StorageHealth
from livefit.server.train.accounting import Progress
from livefit.server.train.snapshots import Snapshots
from livefit.server.train.version_mark import STORAGE_RETRY_FIRST_S, VersionMark
from livefit.server.wire.snapshot import SnapshotSlot
from tests.unit.train.test_accounting import SETTINGS, policy_of
from tests.unit.train.test_version_mark import FullDisk

# An interval no test outlasts: a snapshot that waits for it never comes.
HOURLY = ModelSettings.model_validate({**SETTINGS, "weights": {"serve_interval_s": 3600}})


def snapshots(store: CheckpointStore | None = None) -> tuple[Snapshots, SnapshotSlot]:
    slot = SnapshotSlot()
    step = policy_of(train={"weight_average": 0.0}).step
    mark = VersionMark(store, StorageHealth(Metrics()))
    progress = Progress(lineage="l" * 32, samples_seen=8, newest_published_at=12.5)
    return Snapshots("m", HOURLY, progress, step, None, slot, mark), slot


def test_the_first_version_after_the_start_goes_out_at_once_the_next_after_the_interval() -> None:
    taken, slot = snapshots()
    taken.take_first()
    assert slot.latest is not None and slot.latest.version == 0
    assert not taken.due()  # the version has not moved
    taken.progress.version = 1
    assert taken.due()  # the start's snapshot opened no interval
    first = taken.take()
    assert first is not None and slot.latest is first and first.version == 1
    taken.progress.version = 2
    assert not taken.due() and taken.take() is None  # within serve_interval_s
    assert slot.latest is first
    forced = taken.take(force=True)
    assert forced is not None and forced.version == 2 and slot.latest is forced


def test_a_snapshot_carries_the_served_weights_and_the_progress() -> None:
    taken, _ = snapshots()
    snapshot = taken.take(force=True)
    assert snapshot is not None
    assert (snapshot.model, snapshot.version, snapshot.lineage) == ("m", 0, "l" * 32)
    assert (snapshot.samples_seen, snapshot.newest_published_at) == (8, 12.5)
    assert taken.served_step() is taken.step
    for got, want in zip(snapshot.weights, taken.step.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert taken.take(force=True) is snapshot  # the same version is not copied again


def test_a_snapshot_above_the_version_mark_waits_and_the_newest_goes_out(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "m")
    taken, slot = snapshots(store)
    taken.take_first()  # v0: covered by a new directory's mark
    started = slot.latest
    disk = FullDisk(store)
    for version in (1, 2):
        taken.progress.version = version
        snapshot = taken.take(force=True)
        assert snapshot is not None and taken.held is snapshot  # held back, the newest wins
        assert slot.latest is started
    disk.full = False
    time.sleep(STORAGE_RETRY_FIRST_S + 0.05)
    assert taken.take() is not None  # nothing new to copy: the held one is tried again
    assert taken.held is None
    assert slot.latest is not None and slot.latest.version == 2
    assert store.high_water_mark() >= 2
