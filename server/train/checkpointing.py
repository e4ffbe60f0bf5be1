"""A trainer's durable state (``Checkpointing``): the checkpoint it restores at start, the ones
it takes while it trains and at stop, and how far back the write-ahead log must be kept.

At start it restores the newest checkpoint and continues above every version ever handed out
(the ``VersionMark``). Every ``checkpoint.interval_s`` it copies weights and optimizer state (the
only pause, measured in ``livefit_checkpoint_stall_seconds``) and its ``CheckpointWriter`` writes
them on a background thread. A failed checkpoint is retried on a back-off
(``STORAGE_RETRY_MAX_S`` at most) even while the version stands still, so storage that works
again is noticed within seconds, and a stop writes a final checkpoint unless the one at its exact
version is already on disk; on a clean stop it records that exact version as the mark, so a
restart continues without a jump. Checkpoints keep the configured model's trained weights (with
online model selection, and with ``train.weight_average``, whose average and what chose between
the two travel in the policy's extra arrays).
The log must be kept past the oldest kept checkpoint's position (``log_needed_from``), so that
whichever kept checkpoints are found corrupt at start, the fallback to any older one replays the
log from there without losing anything acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ..base.backoff import Backoff
from ..base.metrics import Metrics
from ..config.model import ModelSettings
from ..storage.checkpoint import Checkpoint, CheckpointStore
from ..storage.health import StorageHealth
from .accounting import Progress
from .checkpoint_writer import CheckpointWriter
from .hooks import TrainerHooks
from .metrics import CheckpointMetrics, TrainingStateMetrics
from .snapshots import Snapshots
from .update_policy import UpdatePolicy
from .version_mark import STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S, VersionMark

log = logging.getLogger(__name__)


class Checkpointing:
    """The checkpoints of model ``name`` in ``store`` (none without one): its ``progress`` and
    ``policy`` (with its step) restored from them, written from ``snapshots``; a failed write
    is reported to ``storage``."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        store: CheckpointStore | None,
        progress: Progress,
        policy: UpdatePolicy,
        snapshots: Snapshots,
        mark: VersionMark,
        hooks: TrainerHooks,
        metrics: Metrics,
        storage: StorageHealth,
    ) -> None:
        self.name = name
        self.settings = settings
        self.store = store
        self.progress = progress
        self.policy = policy
        self.step = policy.step
        self.snapshots = snapshots
        self.mark = mark
        self.hooks = hooks
        self.metrics = metrics
        self.storage = storage
        self.restored_from: Checkpoint | None = None
        self.checkpointed_position = 0  # WAL position the newest written checkpoint is past
        # Positions of the checkpoints kept on disk, oldest first (see log_needed_from)
        keep = store.keep if store is not None else 1
        self._fallback_positions: deque[int] = deque([0], maxlen=max(keep, 1))
        self.writer = CheckpointWriter(name, store, metrics, self.storage) if store else None
        if self.writer is not None:
            self.writer.on_written.append(self._written)
        self._last_at = time.monotonic()  # when the last checkpoint was copied
        self._version = -1  # the version of the last checkpoint copied
        self._durable_version = -1  # newest version whose checkpoint is known to be on disk
        self._durable_lock = threading.Lock()
        self._retry = Backoff(STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S)

    def on_checkpoint(self, callback: Callable[[Checkpoint], None]) -> None:
        """Call ``callback(checkpoint)`` after each checkpoint is on disk (writer thread)."""
        if self.writer is not None:
            self.writer.on_written.append(callback)

    @property
    def log_needed_from(self) -> int:
        """The write-ahead-log position the log must be kept past: the position of the oldest
        checkpoint kept on disk (``checkpoint.keep``), the last a restart can fall back to when
        newer ones are corrupt, or the log's start before ``keep`` were written or restored."""
        return self._fallback_positions[0]

    def restore(self) -> None:
        """Restore the newest checkpoint, if any, and continue above every version handed
        out; a new lineage where there is nothing to continue."""
        if self.store is None:
            return
        checkpoint = self.store.load_latest()
        if self.store.set_aside:
            self.metrics.group(CheckpointMetrics).checkpoints_set_aside.labels(model=self.name).inc(
                len(self.store.set_aside)
            )
        mark = self.store.high_water_mark()
        progress = self.progress
        if checkpoint is None and mark == 0:
            # Nothing to continue: versions restart at 0, so they count a new history.
            progress.lineage = self.store.new_lineage()
        else:
            progress.lineage = self.store.lineage()
            if checkpoint is not None and checkpoint.lineage not in ("", progress.lineage):
                log.warning("%s: checkpoint v%d names lineage %s, its directory %s; using the "
                            "directory's", self.name, checkpoint.version, checkpoint.lineage,
                            progress.lineage)  # fmt: skip
        if checkpoint is not None:
            self.step.restore(checkpoint.weights, checkpoint.optimizer)
            self.policy.restore(checkpoint.extra)
            progress.samples_seen = checkpoint.samples_seen
            progress.trained_position = checkpoint.position
            self.checkpointed_position = checkpoint.position
            self._fallback_positions.append(checkpoint.position)
            self.restored_from = checkpoint
        # Versions up to the mark may have been handed out with weights other than these (a
        # crash after the checkpoint): continue above them. The checkpoint's own version, at or
        # above the mark (a clean stop), was handed out with exactly these weights, if at all.
        if checkpoint is not None and checkpoint.version >= mark:
            progress.version = checkpoint.version
            self._durable_version = progress.version  # a clean stop here needs no new checkpoint
            self._version = progress.version
        elif mark == 0:  # nothing to continue: the new lineage (above) starts at 0, untrained
            progress.version = self._version = 0
        else:  # these weights at a new number: worth a checkpoint of their own
            progress.version, self._version = mark + 1, -1
        self.mark.claimed = mark
        self.metrics.group(TrainingStateMetrics).model_samples.labels(model=self.name).set(
            progress.samples_seen
        )
        self.metrics.group(TrainingStateMetrics).model_version.labels(model=self.name).set(
            progress.version
        )
        if checkpoint is not None:
            log.info(
                "%s restored from checkpoint v%d (%d samples, log position %d); continuing at v%d",
                self.name, checkpoint.version, checkpoint.samples_seen, checkpoint.position,
                progress.version,
            )  # fmt: skip

    def start(self) -> None:
        """Start the background writer."""
        if self.writer is not None:
            self.writer.start()

    def stop(self, stopped: bool) -> None:
        """Let the writer finish; after a clean stop (``stopped``), record the exact version."""
        if self.writer is not None:
            self.writer.stop()  # writes a checkpoint still pending
            if self.writer.failure is not None:  # the exit status stays: the log has the rest
                log.error(
                    "%s: stopping without a final checkpoint (%s); a restart restores checkpoint "
                    "v%d and replays the write-ahead log past its position %d (without the log, "
                    "storage.wal = false, the training since is lost)",
                    self.name, self.writer.failure, max(self._durable_version, 0),
                    self.checkpointed_position,
                )  # fmt: skip
        version = self.progress.version
        if not stopped or self.store is None or self._durable_version != version:
            return
        # A clean stop: the checkpoint at this exact version is on disk, so a restart may
        # continue right here instead of above the claimed block (no version jump).
        if self.mark.record_exact(version):
            self.snapshots.hand_out_held()  # the final snapshot, now covered: serving gets it

    def due(self) -> bool:
        """Whether ``save_if_due`` would copy the state now: the interval is over and the
        version moved, or the last write failed and its retry (``_retry``) is due while the
        state on disk is older than this one."""
        if self.writer is None:
            return False
        version = self.progress.version
        if self.writer.failure is None:
            self._retry.succeeded()
            return (
                version != self._version
                and time.monotonic() - self._last_at >= self.settings.checkpoint.interval_s
            )
        if not self._retry.failing:  # the first wait starts when the failure is seen
            self._retry.failed()
            return False
        return self._durable_version < version and self._retry.due()

    def save_if_due(self, final: bool = False) -> None:
        """Copy the training state for the background writer (or write it now, when final):
        every ``checkpoint.interval_s`` when the version moved, and after a failed write on a
        back-off, at the same version too.

        A final call writes unless the checkpoint at this exact version is on disk or with the
        writer (which ``stop`` lets finish before recording the version)."""
        if self.writer is None:
            return
        version = self.progress.version
        if final:
            if version <= self._durable_version or (
                version == self._version and self.writer.failure is None
            ):
                return
        elif not self.due():
            return
        if self.writer.failure is not None:  # a retry: the next one waits longer
            self._retry.failed()
        started = time.perf_counter()
        snapshot = self.snapshots.take(force=True)  # the checkpoint reuses its copy of the weights
        if snapshot is None:  # cannot happen: a forced snapshot always exists
            raise RuntimeError(f"no snapshot of {self.name} v{version} to checkpoint")
        trained = None
        if self.snapshots.served_step() is not self.step or self.step.serve_average:
            # Checkpoints keep the configured model's trained weights (its averaged ones, if
            # any, travel in the policy's extra arrays) and, beside them, the served ones: the
            # versioned prediction paths serve a checkpoint's version as it was served.
            trained = [np.asarray(w) for w in self.step.model.get_weights()]
        checkpoint = Checkpoint.from_snapshot(
            snapshot,
            position=self.hooks.log_frontier(self.progress.trained_position),
            optimizer=self.step.optimizer_state(),
            extra=self.policy.state(),
            notes=self.hooks.checkpoint_notes(),
            trained=trained,
        )
        self.metrics.group(CheckpointMetrics).checkpoint_stall_seconds.labels(
            model=self.name
        ).observe(time.perf_counter() - started)
        self._last_at = time.monotonic()
        self._version = version
        if final:
            self.writer.write(checkpoint)  # the high-water mark follows in stop()
        else:
            self.writer.offer(checkpoint)

    def _written(self, checkpoint: Checkpoint) -> None:
        self.checkpointed_position = max(self.checkpointed_position, checkpoint.position)
        self._fallback_positions.append(checkpoint.position)
        with self._durable_lock:
            self._durable_version = max(self._durable_version, checkpoint.version)
