"""One trainer thread per model: queue -> dynamic minibatch -> prequential score -> train step.

The trainer owns its Keras model; no other thread touches it. Every ``serve_interval_s``
(and only when the weights changed) it copies them into a ``Snapshot`` for everything
downstream: the learner's own serving swaps each one in, the weight topic's publisher sends
at most one per ``publish_interval_s`` (the newest). The interval stretches to 20 times what
the copy took, so copying a large model never takes more than about 5 % of the trainer's time.
Every ``checkpoint.interval_s`` it copies weights and optimizer state (the only pause,
measured in ``livefit_checkpoint_stall_seconds``) and a background thread writes them
(``checkpointing``, its base class, owns restore, versions and checkpoints).
On stop it trains what was already accepted, hands over a final snapshot and writes a final
checkpoint. A step whose loss, gradients, predictions or new weights are not finite is rolled
back; outlying regression targets are clipped (``update_policy``) and counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np

from ..base.metrics import ErrorMetrics, Metrics
from ..config.model import ModelSettings
from ..ingest.metrics import SampleQueueMetrics
from ..ingest.sample_queue import QueueClosed, SampleQueue
from ..storage.checkpoint import CheckpointStore, new_lineage_id
from ..storage.health import StorageHealth
from ..storage.metrics import StorageMetrics
from ..wire.samples import Batch
from ..wire.snapshot import Snapshot, SnapshotSlot
from .checkpointing import TrainerCheckpoints
from .hooks import TrainerHooks
from .metrics import CheckpointMetrics, TrainingMetrics, TrainingStateMetrics
from .modeling import build_compiled, make_loss
from .prequential import PrequentialScores
from .scaling import LevelShift
from .train_step import TrainStep
from .update_policy import Learned, UpdatePolicy

log = logging.getLogger(__name__)
_POLL_S = 0.1
_GIVE_WAY_POLL_S = 0.0002
_COPY_SHARE = 20.0  # a snapshot interval is at least this many times the copy it costs
_OUTLIER_LOG_INTERVAL_S = 60.0
TRAINER_NICENESS = 5  # added to the trainer thread's OS niceness when it gives way to serving


class Trainer(TrainerCheckpoints):
    """Trains model ``name`` from ``queue`` and publishes snapshots into ``slot``."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        queue: SampleQueue,
        slot: SnapshotSlot,
        metrics: Metrics,
        device: str,
        checkpoints: CheckpointStore | None = None,
        hooks: TrainerHooks | None = None,
        storage: StorageHealth | None = None,
    ) -> None:
        self.name = name
        self.hooks = hooks or TrainerHooks()
        self.settings = settings
        self.queue = queue
        self.slot = slot
        self.metrics = metrics
        metrics.group(TrainingMetrics)
        metrics.group(TrainingStateMetrics)
        metrics.group(CheckpointMetrics)
        metrics.group(StorageMetrics)
        metrics.group(SampleQueueMetrics)
        metrics.group(ErrorMetrics)
        self.device = device
        self._init_checkpoints(checkpoints, storage)
        self.version = 0
        self.lineage = new_lineage_id()  # replaced by the checkpoint dir's own in _restore
        self.samples_seen = 0
        self.trained_position = 0  # WAL position of the last message fully trained
        self.scores = PrequentialScores(
            settings.prequential_window,
            classification="crossentropy" in settings.loss or "accuracy" in settings.metrics,
            sparse=settings.resolved_target_shape() == [],
        )
        self._newest_published_at: float | None = None
        self._last_snapshot_at = 0.0
        self._snapshot_version = -1
        self._last_snapshot: Snapshot | None = None
        self._copy_s = 0.0  # what the last snapshot's copy of the weights took
        self._outliers_logged_at = -_OUTLIER_LOG_INTERVAL_S
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.model = build_compiled(settings, device)
        self.step = TrainStep(
            self.model,
            make_loss(settings),
            settings.input_shape,
            settings.resolved_target_shape(),
            device,
        )
        self.policy = UpdatePolicy(
            settings, self.step, self.hooks.drift_detected, seed=settings.seed
        )

    def warm_up(self) -> None:
        """Restore the newest checkpoint, compile the step, hand serving the first snapshot."""
        self._restore()
        self.step.warm_up()
        self._snapshot(force=True)

    def start(self) -> None:
        if self._writer is not None:
            self._writer.start()
        self._thread = threading.Thread(target=self._run, name=f"trainer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking samples, train what is queued, publish a final snapshot, join."""
        self._stopping.set()
        self.queue.close()
        stopped = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("trainer %s did not stop within %.0fs", self.name, timeout)
                stopped = False
            self._thread = None
        self._stop_checkpoints(stopped)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        train = self.settings.train
        max_wait_s = train.max_wait_ms / 1000.0
        yield_s = train.yield_to_serving_ms / 1000.0
        if yield_s > 0:
            _lower_thread_priority()
        while True:
            try:
                batch = self.queue.next_batch(train.max_batch_size, max_wait_s, timeout=_POLL_S)
            except QueueClosed:
                break
            if batch is not None:
                if yield_s > 0:
                    self._give_way(yield_s)
                self._train_safely(batch)
            self._snapshot()
            self._maybe_checkpoint()
        self._snapshot(force=True)
        self._maybe_checkpoint(final=True)

    def _give_way(self, limit_s: float) -> None:
        """Wait (at most ``limit_s``) while prediction requests are queued: on a small machine
        the trainer's Python work and TensorFlow's kernels otherwise hold the GIL and the cores
        the event loop needs, and predictions wait behind training steps."""
        waiting = self.hooks.predictions_waiting
        if not waiting():
            return
        started = time.perf_counter()
        deadline = started + limit_s
        while waiting() and time.perf_counter() < deadline:
            time.sleep(_GIVE_WAY_POLL_S)
        self.metrics.group(TrainingMetrics).train_yield_seconds.labels(model=self.name).inc(
            time.perf_counter() - started
        )

    def _train_safely(self, batch: Batch) -> None:
        try:
            self.train_batch(batch)
        except Exception:
            # A failing step must not kill the trainer: count it, log it, keep going.
            self.metrics.group(ErrorMetrics).internal_errors.labels(component="trainer").inc()
            log.exception("training step failed for %s (batch of %d)", self.name, len(batch))

    def train_batch(self, batch: Batch) -> None:
        """Score ``batch`` with the current weights, then learn it (a version per step)."""
        started = time.perf_counter()
        # Extra steps and replay spend time the trainer would otherwise wait: not while
        # prediction requests are queued for the model (predictions go first).
        busy = self.hooks.predictions_waiting()
        learned = self.policy.learn(batch, extras_allowed=not busy)
        result = learned.first
        elapsed = time.perf_counter() - started
        if batch.position is not None:
            self.trained_position = batch.position
        if learned.shift is not None:
            self._report_shift(learned.shift)
        if learned.outliers:
            self._count_outliers(learned.outliers)
        if not result.applied:
            self.metrics.group(TrainingMetrics).train_nonfinite.labels(model=self.name).inc()
            log.warning(
                "%s: a batch of %d gave a non-finite loss or weights (loss %s); step rolled back",
                self.name, len(batch), result.loss,
            )  # fmt: skip
            return
        self.version += learned.steps
        if self.version > self._reserved_version:
            self._reserve_versions()
        self.samples_seen += len(batch)
        if batch.newest_published_at is not None:
            self._newest_published_at = max(
                batch.newest_published_at, self._newest_published_at or 0.0
            )
        self.scores.add(result.prequential_losses, learned.y, result.predictions)
        self._record(batch, learned, elapsed)

    def _report_shift(self, shift: LevelShift) -> None:
        """Count and log a change of level of the targets (rare: not rate-limited)."""
        self.metrics.group(TrainingMetrics).train_target_shifts.labels(model=self.name).inc()
        log.warning(
            "%s: %d recent targets lay beyond the outlier bound on one side: a new level, not "
            "outliers; target statistics re-centred on them (features %s, mean %s, std %s), "
            "replay buffer emptied (livefit_train_target_shifts_total)",
            self.name, shift.count, shift.features.tolist(), shift.mean.tolist(),
            np.sqrt(shift.variance).tolist(),
        )  # fmt: skip

    def _count_outliers(self, samples: int) -> None:
        """Count clipped targets; say so in the log at most once a minute."""
        self.metrics.group(TrainingMetrics).train_outliers.labels(model=self.name).inc(samples)
        now = time.monotonic()
        if now - self._outliers_logged_at < _OUTLIER_LOG_INTERVAL_S:
            return
        self._outliers_logged_at = now
        scaler = self.policy.target_scaler
        bounds = None if scaler is None else scaler.bounds(self.policy.target_outlier_std)
        low, high = ("?", "?") if bounds is None else (bounds[0].tolist(), bounds[1].tolist())
        log.warning(
            "%s: %d sample(s) with a target beyond %g standard deviations of the running "
            "target statistics (range %s to %s) were clipped to it "
            "(livefit_train_outliers_total; train.target_outlier_std)",
            self.name, samples, self.policy.target_outlier_std, low, high,
        )  # fmt: skip

    def _record(self, batch: Batch, learned: Learned, elapsed: float) -> None:
        m, name = self.metrics.group(TrainingMetrics), self.name
        state = self.metrics.group(TrainingStateMetrics)
        m.train_steps.labels(model=name).inc(learned.steps)
        m.train_samples.labels(model=name).inc(len(batch))
        m.train_batch_size.labels(model=name).observe(len(batch))
        m.train_step_seconds.labels(model=name).observe(elapsed)
        m.train_loss.labels(model=name).set(learned.first.loss)
        scores = self.scores.scores
        m.prequential_loss.labels(model=name).set(scores["loss"].value)
        if "accuracy" in scores:
            m.prequential_accuracy.labels(model=name).set(scores["accuracy"].value)
        for metric, mean in scores.items():
            m.prequential_score.labels(model=name, metric=metric, window="sliding").set(mean.value)
            m.prequential_score.labels(model=name, metric=metric, window="cumulative").set(
                mean.cumulative
            )
        if learned.replayed:
            state.replayed_samples.labels(model=name).inc(learned.replayed)
        if self.policy.replay is not None:
            state.replay_fill.labels(model=name).set(self.policy.replay.fill_ratio)
        state.model_version.labels(model=name).set(self.version)
        state.model_samples.labels(model=name).set(self.samples_seen)
        queue = self.metrics.group(SampleQueueMetrics)
        queue.queue_depth.labels(model=name).set(len(self.queue))

    def _snapshot(self, force: bool = False) -> Snapshot | None:
        """Hand a copy of the weights to the slot, at most every ``serve_interval_s``
        (stretched to ``_COPY_SHARE`` times the copy's cost) unless ``force``; returns the
        snapshot at the current version, or None when none was due."""
        now = time.monotonic()
        interval = max(self.settings.weights.serve_interval_s, _COPY_SHARE * self._copy_s)
        if self.version == self._snapshot_version:
            return self._last_snapshot
        if not force and now - self._last_snapshot_at < interval:
            return None
        started = time.perf_counter()
        snapshot = Snapshot(
            model=self.name,
            version=self.version,
            weights=tuple(np.asarray(w) for w in self.model.get_weights()),
            created_at=time.time(),
            samples_seen=self.samples_seen,
            newest_published_at=self._newest_published_at,
            lineage=self.lineage,
        )
        self._copy_s = time.perf_counter() - started
        self._last_snapshot_at = now
        self._snapshot_version = self.version
        self._last_snapshot = snapshot
        self.slot.publish(snapshot)
        return snapshot


def _lower_thread_priority() -> None:
    """Raise this thread's niceness (Linux sets it per thread), so that on a busy machine the
    event loop and the serving thread get the cores first. Best effort: skipped where the
    platform does not allow it."""
    try:
        tid = threading.get_native_id()
        niceness = os.getpriority(os.PRIO_PROCESS, tid) + TRAINER_NICENESS
        os.setpriority(os.PRIO_PROCESS, tid, niceness)
    except (AttributeError, OSError):
        log.debug("could not lower the trainer thread's priority", exc_info=True)
