"""The trainer's durable state: restore at start, version reservation, checkpoint cadence.

``TrainerCheckpoints`` is the part of ``Trainer`` that talks to the ``CheckpointStore``: it
restores the newest checkpoint (continuing above every version ever handed out), claims
versions on disk a block at a time before using them, copies the training state every
``checkpoint.interval_s`` for the ``CheckpointWriter`` and, on a clean stop, records the exact
version so a restart continues without a jump. It also says how far back the write-ahead log
must be kept (``log_needed_from``): to the oldest kept checkpoint's position, so that whichever
kept checkpoints are found corrupt at start, the fallback to any older one replays the log from
there without losing anything acknowledged. A base class of ``Trainer``; the attributes
declared below are the trainer's, set by its ``__init__``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ..base.metrics import Metrics
from ..config.model import ModelSettings
from ..storage.checkpoint import Checkpoint, CheckpointStore
from ..storage.health import StorageHealth
from ..wire.snapshot import Snapshot
from .checkpoint_writer import CheckpointWriter
from .hooks import TrainerHooks
from .metrics import CheckpointMetrics, TrainingStateMetrics
from .train_step import TrainStep
from .update_policy import UpdatePolicy

log = logging.getLogger(__name__)
VERSION_BLOCK = 1000  # versions claimed on disk at a time (see _reserve_versions)


class TrainerCheckpoints:
    """Checkpoints and versions of a ``Trainer`` (its base class)."""

    # The trainer's own state this part reads and writes (set by Trainer.__init__).
    name: str
    settings: ModelSettings
    metrics: Metrics
    hooks: TrainerHooks
    step: TrainStep
    policy: UpdatePolicy
    version: int
    lineage: str
    samples_seen: int
    trained_position: int

    def _init_checkpoints(
        self, checkpoints: CheckpointStore | None, storage: StorageHealth | None
    ) -> None:
        """The checkpoint state; ``Trainer.__init__`` calls this once name and metrics are set."""
        name, metrics = self.name, self.metrics
        self.checkpoints = checkpoints
        self.restored_from: Checkpoint | None = None
        self.checkpointed_position = 0  # WAL position the newest written checkpoint is past
        # Positions of the checkpoints kept on disk, oldest first (see log_needed_from)
        keep = checkpoints.keep if checkpoints is not None else 1
        self._fallback_positions: deque[int] = deque([0], maxlen=max(keep, 1))
        self.storage = storage or StorageHealth(metrics)
        self._writer = (
            CheckpointWriter(name, checkpoints, metrics, self.storage) if checkpoints else None
        )
        if self._writer is not None:
            self._writer.on_written.append(self._written)
        self._last_checkpoint_at = time.monotonic()
        self._checkpoint_version = -1
        self._durable_version = -1  # newest version whose checkpoint is known to be on disk
        self._durable_lock = threading.Lock()
        self._reserved_version = 0

    def on_checkpoint(self, callback: Callable[[Checkpoint], None]) -> None:
        """Call ``callback(checkpoint)`` after each checkpoint is on disk (writer thread)."""
        if self._writer is not None:
            self._writer.on_written.append(callback)

    @property
    def log_needed_from(self) -> int:
        """The write-ahead-log position the log must be kept past: the position of the oldest
        checkpoint kept on disk (``checkpoint.keep``), the last a restart can fall back to when
        newer ones are corrupt, or the log's start before ``keep`` were written or restored."""
        return self._fallback_positions[0]

    def _restore(self) -> None:
        if self.checkpoints is None:
            return
        checkpoint = self.checkpoints.load_latest()
        if self.checkpoints.set_aside:
            self.metrics.group(CheckpointMetrics).checkpoints_set_aside.labels(model=self.name).inc(
                len(self.checkpoints.set_aside)
            )
        mark = self.checkpoints.high_water_mark()
        if checkpoint is None and mark == 0:
            # Nothing to continue: versions restart at 0, so they count a new history.
            self.lineage = self.checkpoints.new_lineage()
        else:
            self.lineage = self.checkpoints.lineage()
            if checkpoint is not None and checkpoint.lineage not in ("", self.lineage):
                log.warning("%s: checkpoint v%d names lineage %s, its directory %s; using the "
                            "directory's", self.name, checkpoint.version, checkpoint.lineage,
                            self.lineage)  # fmt: skip
        if checkpoint is not None:
            self.step.restore(checkpoint.weights, checkpoint.optimizer)
            self.policy.restore(checkpoint.extra)
            self.samples_seen = checkpoint.samples_seen
            self.trained_position = checkpoint.position
            self.checkpointed_position = checkpoint.position
            self._fallback_positions.append(checkpoint.position)
            self.restored_from = checkpoint
        # Versions handed out after the checkpoint are never reused: continue above them.
        self.version = max(checkpoint.version if checkpoint else 0, mark)
        self._checkpoint_version = self.version
        if checkpoint is not None and checkpoint.version == self.version:
            self._durable_version = self.version  # a clean stop here needs no new checkpoint
        self._reserved_version = self.version
        self.metrics.group(TrainingStateMetrics).model_samples.labels(model=self.name).set(
            self.samples_seen
        )
        self.metrics.group(TrainingStateMetrics).model_version.labels(model=self.name).set(
            self.version
        )
        if checkpoint is not None:
            log.info(
                "%s restored from checkpoint v%d (%d samples, log position %d); continuing at v%d",
                self.name, checkpoint.version, checkpoint.samples_seen, checkpoint.position,
                self.version,
            )  # fmt: skip

    def _stop_checkpoints(self, stopped: bool) -> None:
        """Let the writer finish; after a clean stop (``stopped``), record the exact version."""
        if self._writer is not None:
            self._writer.stop()  # writes a checkpoint still pending
            if self._writer.failure is not None:  # the exit status stays: the log has the rest
                log.error(
                    "%s: stopping without a final checkpoint (%s); a restart restores checkpoint "
                    "v%d and replays the write-ahead log past its position %d (without the log, "
                    "storage.wal = false, the training since is lost)",
                    self.name, self._writer.failure, max(self._durable_version, 0),
                    self.checkpointed_position,
                )  # fmt: skip
        if stopped and self.checkpoints is not None and self._durable_version == self.version:
            # A clean stop: the checkpoint at this exact version is on disk, so a restart may
            # continue right here instead of above the reserved block (no version jump).
            try:
                self.checkpoints.write_high_water_mark(self.version)
            except OSError as exc:  # the reserved mark stays: a restart jumps, never reuses
                self.storage.failed("version_mark", exc)

    def _reserve_versions(self) -> None:
        """Claim the next block of versions on disk before using the first of them.

        A restart continues above the claimed mark, so no version is ever handed out twice,
        even by a learner killed long after its last checkpoint (versions may jump instead).
        """
        if self.checkpoints is None:
            self._reserved_version = self.version + VERSION_BLOCK
            return
        try:
            self.checkpoints.write_high_water_mark(self.version + VERSION_BLOCK)
        except OSError as exc:  # retried at the next step; until then a crash may reuse versions
            self.storage.failed("version_mark", exc)
            return
        self._reserved_version = self.version + VERSION_BLOCK
        self.storage.recovered("version_mark")

    def _maybe_checkpoint(self, final: bool = False) -> None:
        """Copy the training state for the background writer (or write it now, when final).

        Nothing to do when a checkpoint at this version was already handed to the writer (on
        a final call, ``stop`` lets the writer finish it before recording the version)."""
        if self._writer is None or self.version == self._checkpoint_version:
            return
        interval = self.settings.checkpoint.interval_s
        if not final and time.monotonic() - self._last_checkpoint_at < interval:
            return
        started = time.perf_counter()
        snapshot = self._snapshot(force=True)  # the checkpoint reuses its copy of the weights
        if snapshot is None:  # cannot happen: a forced snapshot always exists
            raise RuntimeError(f"no snapshot of {self.name} v{self.version} to checkpoint")
        checkpoint = Checkpoint.from_snapshot(
            snapshot,
            position=self.hooks.log_frontier(self.trained_position),
            optimizer=self.step.optimizer_state(),
            extra=self.policy.state(),
            notes=self.hooks.checkpoint_notes(),
        )
        self.metrics.group(CheckpointMetrics).checkpoint_stall_seconds.labels(
            model=self.name
        ).observe(time.perf_counter() - started)
        self._last_checkpoint_at = time.monotonic()
        self._checkpoint_version = self.version
        if final:
            self._writer.write(checkpoint)  # the high-water mark follows in stop()
        else:
            self._writer.offer(checkpoint)

    def _written(self, checkpoint: Checkpoint) -> None:
        self.checkpointed_position = max(self.checkpointed_position, checkpoint.position)
        self._fallback_positions.append(checkpoint.position)
        with self._durable_lock:
            self._durable_version = max(self._durable_version, checkpoint.version)

    def _snapshot(self, force: bool = False) -> Snapshot | None:
        raise NotImplementedError  # Trainer's
