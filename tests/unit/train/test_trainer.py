"""The trainer at a start: the first version trained after a fresh start or a restart goes
out at once, later ones at most every ``weights.serve_interval_s``; an untrained model learns
its first joined labels without lingering for more."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import SampleChunk
from livefit.server.wire.snapshot import Snapshot, SnapshotSlot
from tests.step_pool import pooled_steps

# An interval no test outlasts: a snapshot that waits for it never comes.
SETTINGS = ModelSettings.model_validate(
    {"builder": "linear", "input_shape": [2], "output_shape": [1], "seed": 0,
     "train": {"yield_to_serving_ms": 0}, "weights": {"serve_interval_s": 3600},
     "checkpoint": {"interval_s": 3600}}
)  # fmt: skip


def chunk() -> SampleChunk:
    x = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)
    return SampleChunk(x, x[:, :1] * 2, np.ones(4, np.float32))


def learned(trainer: Trainer, samples: int) -> None:
    deadline = time.monotonic() + 30
    while trainer.samples_seen < samples and time.monotonic() < deadline:
        time.sleep(0.01)
    assert trainer.samples_seen == samples


def first_trained_snapshot(directory: Path) -> tuple[Snapshot, Snapshot, Trainer]:
    """Start a trainer on ``directory``, feed it twice; the snapshot at its start, the first
    after it, and the stopped trainer."""
    queue, slot = SampleQueue(1000), SnapshotSlot()
    with pooled_steps():
        trainer = Trainer("m", SETTINGS, queue, slot, Metrics(), "/CPU:0",
                          checkpoints=CheckpointStore(directory, "m"))  # fmt: skip
    trainer.warm_up()
    started, before = slot.latest, trainer.samples_seen
    assert started is not None
    trainer.start()
    try:
        queue.put(chunk())
        first = slot.wait_for(started.version + 1, timeout=30)
        assert first is not None, f"v{started.version} still the newest snapshot after 30 s"
        queue.put(chunk())
        learned(trainer, before + 8)
        assert trainer.version > first.version
        assert slot.latest is first, "a later snapshot came before serve_interval_s"
    finally:
        trainer.stop()
    assert slot.latest is not None and slot.latest.version == trainer.version  # the final one
    return started, first, trainer


def test_the_first_version_trained_after_a_start_or_restart_is_snapshotted_at_once(
    tmp_path: Path,
) -> None:
    started, first, trainer = first_trained_snapshot(tmp_path)
    assert started.version == 0 and first.version >= 1
    restarted, first_again, _ = first_trained_snapshot(tmp_path)
    assert restarted.version == trainer.version  # restored from the final checkpoint
    assert first_again.version > restarted.version


def joined() -> SampleChunk:
    """Four samples as the label join makes them."""
    return replace(chunk(), joined=True)


def test_an_untrained_model_learns_its_first_labels_without_lingering_then_lingers() -> None:
    """``labels.batch_window_ms`` gathers joined labels into a minibatch, but not at version
    0: serving an untrained model while it waits costs more than a one-label batch."""
    window_s = 1.5
    settings = SETTINGS.model_copy(
        update={"labels": SETTINGS.labels.model_copy(update={"batch_window_ms": window_s * 1000})}
    )
    with pooled_steps():
        trainer = Trainer("m", settings, SampleQueue(1000), SnapshotSlot(), Metrics(), "/CPU:0")
    trainer.warm_up()
    assert trainer.version == 0
    trainer.queue.put(joined())
    started = time.monotonic()
    first = trainer.next_batch(timeout=5.0)
    # lingering would have waited the window out (nothing else arrives)
    assert first is not None and time.monotonic() - started < window_s
    trainer.train_batch(first)
    assert trainer.version >= 1
    trainer.queue.put(joined())
    started = time.monotonic()
    second = trainer.next_batch(timeout=5.0)
    assert second is not None and time.monotonic() - started >= window_s * 0.9
