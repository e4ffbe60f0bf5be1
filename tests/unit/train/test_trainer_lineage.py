"""Lineage and version continuity of a real Trainer on a real checkpoint directory.

A lineage id is made with a model's checkpoint directory, kept across restarts and recorded in
every checkpoint; a learner with no storage gets a fresh one per process. After a clean stop
a restarted learner continues at exactly the version it stopped at (it used to jump to the
reserved block: 4,782 -> 5,009).
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.storage.checkpoint import Checkpoint, CheckpointStore
from livefit.server.storage.metrics import StorageMetrics
from livefit.server.train.trainer import Trainer
from livefit.server.train.version_mark import VERSION_BLOCK
from livefit.server.wire.samples import SampleChunk
from livefit.server.wire.snapshot import SnapshotSlot
from tests.step_pool import pooled_steps

SETTINGS = ModelSettings.model_validate(
    {"builder": "linear", "input_shape": [2], "output_shape": [1], "seed": 0,
     "train": {"max_batch_size": 4, "yield_to_serving_ms": 0},
     "checkpoint": {"interval_s": 0.01}, "weights": {"publish_interval_s": 0.01}}
)  # fmt: skip


def trainer(
    directory: Path | None, settings: ModelSettings = SETTINGS
) -> tuple[Trainer, SampleQueue, SnapshotSlot]:
    queue, slot = SampleQueue(1000), SnapshotSlot()
    store = CheckpointStore(directory, "m") if directory is not None else None
    with pooled_steps():
        t = Trainer("m", settings, queue, slot, Metrics(), "/CPU:0", checkpoints=store)
    t.warm_up()
    return t, queue, slot


def feed(queue: SampleQueue, messages: int) -> None:
    rng = np.random.default_rng(messages)
    for _ in range(messages):
        x = rng.normal(size=(4, 2)).astype(np.float32)
        queue.put(SampleChunk(x, x[:, :1] * 2, np.ones(4, np.float32)))


def wait_checkpointed(store: CheckpointStore, version: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newest = store.load_latest()
        if newest is not None and newest.version == version:
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint at v{version} within {timeout}s")


def test_clean_stop_after_a_periodic_checkpoint_continues_exactly(tmp_path: Path) -> None:
    """The last periodic checkpoint already holds the final version: the final one is skipped,
    and the stop must still record the exact version (it recorded nothing: a jump of ~1000)."""
    first, queue, _ = trainer(tmp_path)
    first.start()
    feed(queue, 30)
    deadline = time.monotonic() + 30
    while first.samples_seen < 120 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.samples_seen == 120
    stopped_at = first.version
    assert stopped_at > 0
    wait_checkpointed(first.checkpoints, stopped_at)  # type: ignore[arg-type]
    first.stop()
    assert first.version == stopped_at
    assert first.checkpoints is not None
    assert first.checkpoints.high_water_mark() == stopped_at

    second, _, slot = trainer(tmp_path)
    assert second.version == stopped_at, f"restarted at {second.version}, stopped at {stopped_at}"
    assert second.lineage == first.lineage
    assert slot.latest is not None and slot.latest.version == stopped_at
    assert slot.latest.lineage == first.lineage
    second.stop()


def test_clean_stop_with_a_final_checkpoint_continues_exactly(tmp_path: Path) -> None:
    slow = SETTINGS.model_copy(update={"checkpoint": SETTINGS.checkpoint.model_copy(
        update={"interval_s": 3600})})  # fmt: skip
    queue, slot = SampleQueue(1000), SnapshotSlot()
    with pooled_steps():
        first = Trainer("m", slow, queue, slot, Metrics(), "/CPU:0",
                        checkpoints=CheckpointStore(tmp_path, "m"))  # fmt: skip
    first.warm_up()
    first.start()
    feed(queue, 10)
    first.stop()
    assert first.samples_seen == 40
    second, _, _ = trainer(tmp_path)
    assert second.version == first.version
    second.stop()


def test_a_crash_still_continues_above_every_version_handed_out(tmp_path: Path) -> None:
    """Without a clean stop the claimed block stands (versions jump, never repeat): the
    restart continues one above the mark, whose own version may have been handed out."""
    first, queue, _ = trainer(tmp_path)
    first.start()
    feed(queue, 5)
    deadline = time.monotonic() + 30
    while first.samples_seen < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    used = first.version
    # A crash: nothing of stop() runs. The mark on disk is what a restart sees.
    mark = CheckpointStore(tmp_path, "m").high_water_mark()
    assert used < mark <= used + VERSION_BLOCK
    second, _, _ = trainer(tmp_path)
    assert second.version == mark + 1
    second.stop()
    first.stop()


def test_lineage_is_made_with_the_directory_kept_and_recorded(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints" / "m"
    store = CheckpointStore(directory, "m")
    lineage = (directory / "lineage").read_text()
    assert len(lineage) == 32 and store.lineage() == lineage
    assert CheckpointStore(directory, "m").lineage() == lineage  # reopened: the same
    weights = [np.zeros((2, 1), np.float32)]
    store.write(Checkpoint("m", 3, 0, 0, weights, [], lineage=lineage))
    loaded = store.load_latest()
    assert loaded is not None and loaded.lineage == lineage

    assert CheckpointStore(tmp_path / "elsewhere", "m").lineage() != lineage
    # A trainer restored from this directory takes its lineage (a trained one is restarted in
    # test_clean_stop_after_a_periodic_checkpoint_continues_exactly).


def test_no_storage_means_a_new_lineage_per_process() -> None:
    a, _, slot_a = trainer(None)
    b, _, _ = trainer(None)
    assert a.lineage and b.lineage and a.lineage != b.lineage
    assert slot_a.latest is not None and slot_a.latest.lineage == a.lineage
    a.stop()
    b.stop()


def test_a_directory_with_no_version_history_starts_a_new_lineage(tmp_path: Path) -> None:
    """A learner that never trained restarts at v0 with new random weights: another history."""
    first, _, _ = trainer(tmp_path)
    first.stop()
    assert first.version == 0
    second, _, _ = trainer(tmp_path)
    assert second.version == 0 and second.lineage != first.lineage
    second.stop()


@pytest.mark.parametrize("average", [0.0, 0.95])
def test_a_checkpoint_is_the_served_snapshot_plus_optimizer_state(
    tmp_path: Path, average: float
) -> None:
    """One copy of the weights leaves the trainer: the checkpoint at version v holds the very
    arrays of the snapshot serving got at v (not a second ``get_weights`` copy), beside the
    optimizer state, and both round-trip through the file. Unless the snapshot carries the
    averaged weights (``train.weight_average``): then the checkpoint holds the trained ones."""
    train = SETTINGS.train.model_copy(update={"weight_average": average})
    t, queue, slot = trainer(tmp_path, SETTINGS.model_copy(update={"train": train}))
    written: list[Checkpoint] = []
    t.on_checkpoint(written.append)
    t.start()
    feed(queue, 20)
    t.stop()
    assert written, "no checkpoint was written"
    # the newest: a periodic one still on the writer thread may report after the final one
    final = max(written, key=lambda checkpoint: checkpoint.version)
    snapshot = slot.latest
    assert snapshot is not None and snapshot.version == final.version == t.version
    if t.step.serve_average:
        for a, b in zip(final.weights, t.model.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
        assert "average_steps" in final.extra
    else:
        assert all(a is b for a, b in zip(final.weights, snapshot.weights, strict=True))
    assert final.lineage == snapshot.lineage and final.samples_seen == snapshot.samples_seen
    on_disk = CheckpointStore(tmp_path, "m").load_latest()
    assert on_disk is not None and on_disk.version == final.version
    for a, b in zip(on_disk.weights, final.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(on_disk.optimizer) == len(t.step.optimizer_state()) > 0


def test_a_stop_whose_final_checkpoint_fails_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26 item 3: a SIGTERM whose final checkpoint failed exited 0 and said nothing. Now
    the failure is storage trouble and the stop logs an error naming it (the exit status stays
    0: the write-ahead log holds everything since the last checkpoint)."""
    slow = SETTINGS.model_copy(update={"checkpoint": SETTINGS.checkpoint.model_copy(
        update={"interval_s": 3600})})  # fmt: skip
    queue, slot = SampleQueue(1000), SnapshotSlot()
    store = CheckpointStore(tmp_path, "m")
    with pooled_steps():
        t = Trainer("m", slow, queue, slot, Metrics(), "/CPU:0", checkpoints=store)
    t.warm_up()

    def refuse(checkpoint: Checkpoint) -> Path:
        raise ValueError("Error while serializing: header too large")

    store.write = refuse  # type: ignore[method-assign]
    t.start()
    feed(queue, 10)
    with caplog.at_level(logging.ERROR):
        t.stop()
    assert t.samples_seen == 40 and not store.paths()
    assert (
        not t.storage.healthy and t.metrics.group(StorageMetrics).storage_healthy._value.get() == 0
    )
    assert "stopping without a final checkpoint" in caplog.text
    assert "header too large" in caplog.text


class FullDisk:
    """Makes a store's writes of one kind fail as a full disk does while ``full`` is set."""

    def __init__(self, store: CheckpointStore, method: str) -> None:
        self.full = True
        self.calls = 0
        real = getattr(store, method)

        def write(*args: object) -> object:
            self.calls += 1
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args)

        setattr(store, method, write)


def test_no_snapshot_leaves_above_the_version_mark_on_disk(tmp_path: Path) -> None:
    """Issue 45 item 1: while the mark could not be written, the trainer published on past it,
    and a restart after a crash handed those versions out again. Now training goes on but the
    snapshots wait; once the mark is written they go out, and a crash restart continues above
    every one of them."""
    t, queue, slot = trainer(tmp_path)
    assert slot.latest is not None and slot.latest.version == 0
    published: list[int] = []
    slot.subscribe(lambda snapshot: published.append(snapshot.version))
    store = t.checkpoints
    assert store is not None
    disk = FullDisk(store, "write_high_water_mark")
    t.start()
    try:
        feed(queue, 5)  # the first claim fails: nothing above v0 may leave
        deadline = time.monotonic() + 30
        while t.samples_seen < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)
        assert t.samples_seen == 20 and t.version > 0  # trained on
        assert not published and slot.latest.version == 0, published
        assert any("version_mark" in p for p in t.storage.problems())
        tries = disk.calls
        time.sleep(1.5)
        assert disk.calls <= tries + 2  # tried again on a back-off, not at every poll
        disk.full = False
        deadline = time.monotonic() + 10
        while slot.latest.version != t.version and time.monotonic() < deadline:
            time.sleep(0.05)
        assert published == [t.version] and t.storage.healthy  # handed out once claimed
        mark = store.high_water_mark()
        assert mark >= t.version
        second, _, second_slot = trainer(tmp_path)  # a crash: no stop, the mark on disk stands
        second.stop()
        assert second_slot.latest is not None and second_slot.latest.version == mark + 1
    finally:
        t.stop()


def test_a_failed_checkpoint_is_retried_at_the_same_version_and_written_at_stop(
    tmp_path: Path,
) -> None:
    """Issue 45 item 2: a checkpoint that failed was retried only when the version moved on, so
    storage that worked again stayed unhealthy, and a stop at that version wrote none."""
    t, queue, _ = trainer(tmp_path)
    store = t.checkpoints
    assert store is not None
    disk = FullDisk(store, "write")
    t.start()
    try:
        failing_then_back(t, queue, disk, store)
    finally:
        disk.full = False
        t.stop()
    newest = store.load_latest()
    assert newest is not None and newest.version == t.version  # the stop wrote it
    assert store.high_water_mark() == t.version  # and a restart continues right there


def failing_then_back(
    t: Trainer, queue: SampleQueue, disk: FullDisk, store: CheckpointStore
) -> None:
    """Train while checkpoints fail, free the disk and wait for a checkpoint at the trainer's
    unchanged version; then train while they fail again (the caller stops)."""
    feed(queue, 5)
    deadline = time.monotonic() + 30
    while (t.samples_seen < 20 or t.storage.healthy) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.samples_seen == 20 and not t.storage.healthy
    disk.full = False  # the trainer is idle: its version stands still
    deadline = time.monotonic() + 15
    while not t.storage.healthy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert t.storage.healthy
    newest = store.load_latest()
    assert newest is not None and newest.version == t.version

    disk.full = True  # again, and now stop while the checkpoint fails
    feed(queue, 5)
    deadline = time.monotonic() + 30
    while (t.samples_seen < 40 or t.storage.healthy) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.samples_seen == 40 and not t.storage.healthy
