"""``Checkpointing`` on a real checkpoint directory with a real step: a fresh directory starts a
new lineage at v0, a clean stop's restart continues at exactly its version and a crash's above
the mark, a failed write is retried on a back-off, and the log is kept past the oldest kept
checkpoint."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.storage.checkpoint import Checkpoint, CheckpointStore
from livefit.server.storage.health import StorageHealth
from livefit.server.train.accounting import Progress
from livefit.server.train.checkpointing import Checkpointing
from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.snapshots import Snapshots
from livefit.server.train.version_mark import STORAGE_RETRY_FIRST_S, VERSION_BLOCK, VersionMark
from livefit.server.wire.snapshot import SnapshotSlot
from tests.unit.train.test_accounting import SETTINGS, batch_of, policy_of

HOURLY = ModelSettings.model_validate({**SETTINGS, "checkpoint": {"interval_s": 3600}})


class Frontier(TrainerHooks):
    """The log is needed past what is trained, as the learner's hooks say."""

    def log_frontier(self, trained_position: int) -> int:
        return trained_position


def checkpointing(directory: Path, keep: int = 3) -> Checkpointing:
    store = CheckpointStore(directory, "m", keep=keep)
    storage = StorageHealth(Metrics())
    policy, progress, mark = policy_of(), Progress(lineage="new"), VersionMark(store, storage)
    snapshots = Snapshots("m", HOURLY, progress, policy.step, None, SnapshotSlot(), mark)
    return Checkpointing("m", HOURLY, store, progress, policy, snapshots, mark, Frontier(),
                         Metrics(), storage)  # fmt: skip


def trained(parts: Checkpointing, batches: int, position: int) -> None:
    """``batches`` learned as the trainer would count them, up to log ``position``."""
    for seed in range(batches):
        learned = parts.policy.learn(batch_of(4, seed=seed))
        parts.progress.version += learned.steps
        parts.progress.samples_seen += 4
    parts.progress.trained_position = position


def test_a_fresh_directory_starts_a_new_lineage_at_v0(tmp_path: Path) -> None:
    parts = checkpointing(tmp_path)
    parts.restore()
    assert parts.store is not None
    assert parts.progress.lineage == parts.store.lineage() != "new"
    assert (parts.progress.version, parts.restored_from, parts.mark.claimed) == (0, None, 0)
    assert not parts.due()  # nothing trained, and the interval is an hour


def test_a_clean_stop_restarts_at_its_exact_version_with_its_state(tmp_path: Path) -> None:
    parts = checkpointing(tmp_path)
    parts.restore()
    trained(parts, 3, position=17)
    version = parts.progress.version
    parts.start()
    parts.save_if_due(final=True)
    parts.stop(stopped=True)
    assert parts.store is not None and parts.store.high_water_mark() == version  # exact
    weights = parts.step.model.get_weights()

    again = checkpointing(tmp_path)
    again.restore()
    progress = again.progress
    assert (progress.version, progress.samples_seen, progress.trained_position) == (version, 12, 17)
    assert progress.lineage == parts.progress.lineage
    assert again.restored_from is not None and again.restored_from.version == version
    for got, want in zip(again.step.model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    again.save_if_due(final=True)  # the checkpoint at this version is on disk: none written
    assert len(again.store.paths()) == 1  # type: ignore[union-attr]


def test_after_a_crash_a_restart_continues_above_every_version_handed_out(
    tmp_path: Path,
) -> None:
    parts = checkpointing(tmp_path)
    parts.restore()
    trained(parts, 2, position=9)
    version = parts.progress.version
    parts.save_if_due(final=True)  # its snapshot claimed a block of versions
    parts.stop(stopped=False)  # no exact mark: as after a crash
    assert parts.store is not None and parts.store.high_water_mark() == version + VERSION_BLOCK

    again = checkpointing(tmp_path)
    again.restore()
    assert again.progress.version == version + VERSION_BLOCK + 1
    assert again.progress.samples_seen == 8 and again.mark.claimed == version + VERSION_BLOCK
    again.save_if_due(final=True)  # these weights at a new number: a checkpoint of their own
    newest = again.store.load_latest()  # type: ignore[union-attr]
    assert newest is not None and newest.version == version + VERSION_BLOCK + 1


def test_a_failed_write_is_retried_on_a_back_off_at_the_same_version(tmp_path: Path) -> None:
    parts = checkpointing(tmp_path)
    parts.restore()
    trained(parts, 1, position=3)
    store = parts.store
    assert store is not None
    real, full = store.write, [True]

    def write(checkpoint: Checkpoint) -> Path:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(checkpoint)

    store.write = write  # type: ignore[method-assign]
    parts.save_if_due(final=True)
    assert not store.paths() and not parts.storage.healthy
    assert not parts.due()  # the failure seen: the first wait starts
    assert not parts.due()
    time.sleep(STORAGE_RETRY_FIRST_S + 0.05)
    assert parts.due()  # the same version, tried again
    full[0] = False
    parts.save_if_due(final=True)
    assert len(store.paths()) == 1 and parts.storage.healthy
    assert not parts.due()


def test_the_log_is_kept_past_the_oldest_checkpoint_kept(tmp_path: Path) -> None:
    parts = checkpointing(tmp_path, keep=2)
    parts.restore()
    written: list[int] = []
    parts.on_checkpoint(lambda checkpoint: written.append(checkpoint.position))
    needed = [parts.log_needed_from]
    for position in (10, 20, 30):
        trained(parts, 1, position=position)
        parts.save_if_due(final=True)
        needed.append(parts.log_needed_from)
    assert written == [10, 20, 30]
    assert needed == [0, 0, 10, 20]  # the log's start until two were kept, then the older one
    assert parts.checkpointed_position == 30
