"""One trainer thread per model: queue -> dynamic minibatch -> prequential score -> train step.

The trainer owns its Keras model; no other thread touches it. Every ``serve_interval_s``
(and only when the weights changed) it copies them into a ``Snapshot`` for everything
downstream: the learner's own serving swaps each one in, the weight topic's publisher sends
at most one per ``publish_interval_s`` (the newest). The interval stretches to 20 times what
the copy took, so copying a large model never takes more than about 5 % of the trainer's time;
the first version trained after a start goes out at once (the start's own snapshot, of the
restored or initial weights, opens no interval).
Every ``checkpoint.interval_s`` it copies weights and optimizer state (the only pause,
measured in ``livefit_checkpoint_stall_seconds``) and its ``CheckpointWriter`` writes them on a
background thread. On stop it trains what was already accepted, hands over a final snapshot
and writes a final checkpoint. A step whose loss, gradients, predictions or new weights are
not finite is rolled back; outlying regression targets are clipped (``update_policy``) and
counted.
With online model selection (``selection.enabled``) a ``CandidateSet`` trains every candidate
on each batch; snapshots carry the served candidate's weights, checkpoints the configured one's.
With weight averaging (``train.weight_average``) snapshots carry the averaged weights (what
was scored), checkpoints the trained ones, the average and what chose between them.

Its durable state: at start it restores the newest checkpoint (continuing above every version
ever handed out), and no snapshot leaves it with a version the version mark on disk does not
cover: it claims versions there a block at a time. While the mark cannot be written (a full
disk) training goes on, but the newest snapshot is held back (serving and replicas keep the
last one handed out; readiness names ``version_mark``) until a retry on a back-off writes it,
so a restart after a crash never hands out a number again. On a clean stop it records the
exact version so a restart continues without a jump. A failed checkpoint is retried on a
back-off (``STORAGE_RETRY_MAX_S`` at most) even while the version stands still, so storage that
works again is noticed within seconds, and a stop writes a final checkpoint unless the one at
its exact version is already on disk. It also says how far back the write-ahead log must be kept
(``log_needed_from``): to the oldest kept checkpoint's position, so that whichever kept
checkpoints are found corrupt at start, the fallback to any older one replays the log from
there without losing anything acknowledged.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..base.backoff import Backoff
from ..base.metrics import ErrorMetrics, Metrics
from ..config.machine import usable_cores
from ..config.model import ModelSettings
from ..ingest.metrics import SampleQueueMetrics
from ..ingest.sample_queue import QueueClosed, SampleQueue
from ..storage.checkpoint import Checkpoint, CheckpointStore, new_lineage_id
from ..storage.health import StorageHealth
from ..storage.metrics import StorageMetrics
from ..wire.samples import Batch
from ..wire.snapshot import Snapshot, SnapshotSlot
from .checkpoint_writer import CheckpointWriter
from .hooks import TrainerHooks
from .metrics import CheckpointMetrics, SelectionMetrics, TrainingMetrics, TrainingStateMetrics
from .modeling import build_compiled, experts_rule, make_loss
from .placement import Placement, as_placement
from .prequential import PrequentialScores
from .scaling import LevelShift
from .selection import CandidateSet
from .train_step import TrainStep
from .update_policy import Learned, Started, UpdatePolicy

log = logging.getLogger(__name__)
_POLL_S = 0.1
_GIVE_WAY_POLL_S = 0.0002
_COPY_SHARE = 20.0  # a snapshot interval is at least this many times the copy it costs
_OUTLIER_LOG_INTERVAL_S = 60.0
TRAINER_NICENESS = 5  # added to the trainer thread's OS niceness when it gives way to serving
# A fresh model's smallest batch while it starts (``Trainer.batch_limit``). Measured over 15
# streams and 4 model seeds, a first message of 25 learned in batches of 5, 5, 10 and 5
# against one of 25 (BENCHMARKS.md, learning quality): 1, 1, 2, 4, 8, 9 lost 15 % MAE on
# Planes2D and 2 points on Agrawal (a 1-sample step moves the network as far as a full one).
FAST_START_MIN_BATCH = 5
VERSION_BLOCK = 1000  # versions claimed on disk at a time (see _claim)
# While storage fails, a checkpoint or a version mark is tried again after 1, 2, 4, 5, 5... s
STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S = 1.0, 5.0


class Trainer:
    """Trains model ``name`` from ``queue`` and publishes snapshots into ``slot``."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        queue: SampleQueue,
        slot: SnapshotSlot,
        metrics: Metrics,
        device: str | Placement,
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
        placement = as_placement(device)  # one device, or several mirrored
        self.placement = placement
        self.device = placement.primary
        self._init_checkpoints(checkpoints, storage)
        self.version = 0
        self.lineage = new_lineage_id()  # replaced by the checkpoint dir's own in _restore
        self.samples_seen = 0
        self.fast_start_samples = settings.resolved_fast_start_samples()
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
        self._held: Snapshot | None = None  # the newest snapshot not handed out yet (_hand_out)
        self._copy_s = 0.0  # what the last snapshot's copy of the weights took
        self._outliers_logged_at = -_OUTLIER_LOG_INTERVAL_S
        self._series: dict[str, Any] | None = None  # labelled metric series, see _record
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.model = build_compiled(settings, placement)
        self.pipelined = pipelining(settings, placement, self.hooks.serving_here)
        self.thread_cpu_s = 0.0  # CPU time of the trainer's thread, set when it ends
        self.rewinds = 0  # steps the pipeline started early and had to run again
        self.step = TrainStep(
            self.model,
            make_loss(settings),
            settings.input_shape,
            settings.resolved_target_shape(),
            placement,
            weight_average=settings.train.weight_average,
            rewindable=self.pipelined,
            experts=experts_rule(settings),
        )
        # A drift found during a step is reported once the step is counted, so that the
        # event's samples_seen includes the batch that showed it.
        self._drift_found: int | None = None
        self.policy = UpdatePolicy(settings, self.step, self._found_drift, seed=settings.seed)
        # Online model selection: more candidates beside this policy's model (selection.py)
        self.candidates = (
            CandidateSet(name, settings, self.policy, placement)
            if settings.selection.enabled
            else None
        )
        if self.candidates is not None:
            self._record_selection()

    def warm_up(self) -> None:
        """Restore the newest checkpoint, compile the step, hand serving the first snapshot."""
        self._restore()
        self.step.warm_up()
        if self.candidates is not None:
            self.candidates.warm_up()
        self._snapshot(force=True)
        # The start's snapshot opens no interval: the first version trained goes out at once.
        self._last_snapshot_at = -math.inf

    def start(self) -> None:
        if self._writer is not None:
            self._writer.start()
        if self.pipelined:
            log.info("%s: training steps pipelined (train.pipeline = %r)", self.name,
                     self.settings.train.pipeline)  # fmt: skip
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
        started = time.thread_time()
        try:
            self._train_until_closed()
        finally:
            # the CPU time this thread used, once it ends (the trainer benchmark reads it)
            self.thread_cpu_s = time.thread_time() - started

    def _train_until_closed(self) -> None:
        train = self.settings.train
        max_wait_s = train.max_wait_ms / 1000.0
        yield_s = train.yield_to_serving_ms / 1000.0
        if yield_s > 0:
            _lower_thread_priority()
        if self.pipelined:
            self._run_pipelined(max_wait_s, yield_s)
            return
        while True:
            try:
                batch = self.next_batch(max_wait_s, timeout=_POLL_S)
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

    def _run_pipelined(self, max_wait_s: float, yield_s: float) -> None:
        """``_train_until_closed`` with the next plain batch's step started before the previous
        batch is finished (``train.pipeline``).

        This thread's TensorFlow executor is asynchronous, so a dispatched step runs on
        TensorFlow's threads while this one does the previous batch's bookkeeping (its
        scores, drift test, replay, metrics) and the next batch's scaling. Measured: the
        bookkeeping between two steps also costs the step 200-300 us to wake TensorFlow's
        idle threads, which a step already queued avoids (BENCHMARKS.md, trainer). The next
        step is started assuming the previous one applies and brings no drift reaction;
        where it does not, the next step is rewound (``TrainStep.rewind``) with the policy
        (``UpdatePolicy.state_point``) and started again once the previous batch is finished,
        so the model, its versions and its scores are those of one batch after the other.
        Snapshots and checkpoints are taken between batches with nothing running.
        """
        from tensorflow.python.eager import context

        ctx = context.context()
        # This thread's executor only (the context keeps it alive; an executor object set
        # with ``ctx.executor`` and dropped leaves the thread synchronous).
        ctx.execution_mode = context.ASYNC
        pending: _Pending | None = None
        try:
            while True:
                full = self.settings.train.max_batch_size
                if pending is not None and (
                    (max_wait_s > 0 and len(self.queue) < full) or self.batch_limit() < full
                ):
                    # The next batch would linger (train.max_wait_ms) to fill up, or its size
                    # depends on what this one learns (the fast start, ``batch_limit``):
                    # finish this one first, as one batch after the other would.
                    self._complete(pending)
                    pending = None
                    self._snapshot()
                    self._maybe_checkpoint()
                try:
                    batch = self.next_batch(
                        max_wait_s, timeout=0.0 if pending is not None else _POLL_S
                    )
                except QueueClosed:
                    break
                if batch is not None:
                    if yield_s > 0:
                        self._give_way(yield_s)
                    try:
                        pending = self._overlap(pending, batch)
                    except Exception:  # _overlap catches its steps' own errors: a last net
                        self._failed(batch)
                        pending = None
                elif pending is not None:  # nothing more arrived: finish what runs
                    self._complete(pending)
                    pending = None
                if pending is not None and (self._snapshot_due() or self._checkpoint_due()):
                    self._complete(pending)
                    pending = None
                if pending is None:
                    self._snapshot()
                    self._maybe_checkpoint()
            self._complete(pending)
            self._snapshot(force=True)
            self._maybe_checkpoint(final=True)
        finally:
            try:
                ctx.executor.wait()
            except Exception:  # an error of a step already counted: nothing more to do
                ctx.executor.clear_error()
            ctx.execution_mode = context.SYNC

    def _overlap(self, pending: _Pending | None, batch: Batch) -> _Pending | None:
        """Start ``batch`` and finish ``pending``: the start first where both are plain
        batches (the overlap), else one after the other. Returns what is left running."""
        started_at = time.perf_counter()
        extras_allowed = not self.hooks.predictions_waiting()
        policy = self.policy
        if (
            pending is None
            or pending.started.dispatched is None
            or not policy.plain(batch, extras_allowed)
        ):
            self._complete(pending)
            return self._start(batch, extras_allowed, started_at)
        point = policy.state_point()
        policy.assume_applied(pending.started)
        try:
            following = policy.start(batch, extras_allowed)
        except Exception:
            # Maybe the previous step's own error, which an asynchronous executor reports at
            # the next call: finish that batch first (its error is counted there), then start
            # this one again, which now fails only for its own reasons.
            policy.restore_point(point)
            pending.started.assumed = False
            _clear_async_error()
            self._complete(pending)
            return self._start(batch, extras_allowed, started_at)
        rewound = False

        def rewind() -> None:
            """The previous step did not apply or brought a drift reaction (or failed): undo
            ``following`` (its step and what starting it changed), to be started again."""
            nonlocal rewound
            rewound = True
            self.rewinds += 1
            self.metrics.group(TrainingMetrics).train_rewinds.labels(model=self.name).inc()
            try:
                applied = self.step.collect(following.dispatched).applied  # type: ignore[arg-type]
            except Exception:  # not run: the executor failed on the step before it
                _clear_async_error()
                applied = False
            if applied:
                self.step.rewind()
            policy.restore_point(point)

        if not self._complete(pending, rewind) and not rewound:
            rewind()  # the previous batch failed: ``following`` assumed it had applied
        if rewound:
            return self._start(batch, extras_allowed, started_at)
        return _Pending(following, batch, started_at)

    def _start(self, batch: Batch, extras_allowed: bool, started_at: float) -> _Pending | None:
        """Start ``batch``; a batch with extra steps is finished here too."""
        try:
            started = self.policy.start(batch, extras_allowed)
        except Exception:
            self._failed(batch)
            return None
        pending = _Pending(started, batch, started_at)
        if started.dispatched is not None:
            return pending
        self._complete(pending)
        return None

    def _complete(
        self, pending: _Pending | None, surprise: Callable[[], None] | None = None
    ) -> bool:
        """Finish ``pending`` (waits for its step) and account for it; False where that
        raised (counted and logged)."""
        if pending is None:
            return True
        try:
            learned = self.policy.finish(pending.started, surprise)
            self._account(pending.batch, learned, time.perf_counter() - pending.started_at)
        except Exception:
            self._failed(pending.batch)
            return False
        return True

    def _failed(self, batch: Batch) -> None:
        """Count and log a batch whose learning raised (as ``_train_safely`` does), and clear
        an asynchronous executor's error state, which would fail every later step."""
        self.metrics.group(ErrorMetrics).internal_errors.labels(component="trainer").inc()
        log.exception("training step failed for %s (batch of %d)", self.name, len(batch))
        _clear_async_error()

    def _snapshot_due(self) -> bool:
        interval = max(self.settings.weights.serve_interval_s, _COPY_SHARE * self._copy_s)
        return (
            self.version != self._snapshot_version
            and time.monotonic() - self._last_snapshot_at >= interval
        )

    def _checkpoint_due(self) -> bool:
        """Whether ``_maybe_checkpoint`` would copy the state now: the interval is over and the
        version moved, or the last write failed and its retry (``_checkpoint_retry``) is due
        while the state on disk is older than this one."""
        if self._writer is None:
            return False
        if self._writer.failure is None:
            self._checkpoint_retry.succeeded()
            return (
                self.version != self._checkpoint_version
                and time.monotonic() - self._last_checkpoint_at
                >= self.settings.checkpoint.interval_s
            )
        if not self._checkpoint_retry.failing:  # the first wait starts when the failure is seen
            self._checkpoint_retry.failed()
            return False
        return self._durable_version < self.version and self._checkpoint_retry.due()

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

    def batch_limit(self) -> int:
        """The most samples the next batch may hold: ``train.max_batch_size``, and while the
        model has learned fewer than ``fast_start_samples`` (``train.fast_start_samples``, by
        default 100 for regression losses and 0 for the others: a fresh model), no more
        than it has learned, nor fewer than ``FAST_START_MIN_BATCH``: a fresh model's first
        batches grow 5, 5, 10, 20, ..., so that it learns its first samples in several steps,
        each batch scored before it is learned, instead of in one."""
        train = self.settings.train
        if self.samples_seen >= self.fast_start_samples:
            return train.max_batch_size
        return min(train.max_batch_size, max(FAST_START_MIN_BATCH, self.samples_seen))

    def next_batch(self, max_wait_s: float = 0.0, timeout: float | None = None) -> Batch | None:
        """The next minibatch from the queue (``SampleQueue.next_batch``) within
        ``batch_limit``, lingering ``labels.batch_window_ms`` for more joined labels where it
        holds only those; a batch cut short by the fast start counts as a full-size batch
        would (its ``backlog``: the samples a ``train.max_batch_size`` batch would have left),
        so that the fast start alone does not make it a batch taken from a backlog."""
        limit = self.batch_limit()
        joined_wait_s = self.settings.labels.batch_window_ms / 1000.0
        batch = self.queue.next_batch(limit, max_wait_s, timeout, joined_wait_s)
        full = self.settings.train.max_batch_size
        if batch is None or limit == full or not batch.backlog:
            return batch
        return replace(batch, backlog=max(0, len(batch) + batch.backlog - full))

    def train_batch(self, batch: Batch) -> None:
        """Score ``batch`` with the current weights, then learn it (a version per step)."""
        started = time.perf_counter()
        # Extra steps and replay spend time the trainer would otherwise wait: not while
        # prediction requests are queued for the model (predictions go first).
        busy = self.hooks.predictions_waiting()
        if self.candidates is None:
            learned = self.policy.learn(batch, extras_allowed=not busy)
        else:  # every candidate learns; what the served one predicted is what counts
            learned = self.candidates.learn(batch, extras_allowed=not busy)
        self._account(batch, learned, time.perf_counter() - started)

    def _account(self, batch: Batch, learned: Learned, elapsed: float) -> None:
        """What learning ``batch`` did, counted: versions, samples, scores, metrics, logs."""
        result = learned.first
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
        self.samples_seen += len(batch)
        if self._drift_found is not None:
            detections, self._drift_found = self._drift_found, None
            self.hooks.drift_detected(detections)
        if batch.newest_published_at is not None:
            self._newest_published_at = max(
                batch.newest_published_at, self._newest_published_at or 0.0
            )
        self.scores.add(result.prequential_losses, learned.y, result.predictions)
        self._record(batch, learned, elapsed)
        if self.candidates is not None:
            self._select()

    def _found_drift(self, detections: int) -> None:
        self._drift_found = detections

    def _select(self) -> None:
        """Serve the best candidate (with hysteresis); count, log and report a switch."""
        assert self.candidates is not None
        switch = self.candidates.reconsider()
        self._record_selection()
        if switch is None:
            return
        self.metrics.group(SelectionMetrics).selection_switches.labels(model=self.name).inc()
        log.info(
            "%s: serving candidate %s instead of %s from v%d (windowed prequential loss %s; "
            "livefit_selection_switches_total)",
            self.name, switch.new, switch.old, self.version,
            ", ".join(f"{n} {v:.6g}" for n, v in switch.scores.items()),
        )  # fmt: skip
        self.hooks.selection_switched(switch, self.version)

    def _record_selection(self) -> None:
        assert self.candidates is not None
        m = self.metrics.group(SelectionMetrics)
        served = self.candidates.served.name
        for candidate, score in self.candidates.scores().items():
            m.selection_score.labels(model=self.name, candidate=candidate).set(score)
            m.selection_served.labels(model=self.name, candidate=candidate).set(candidate == served)

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
        scaler = self.policy.scaling.target_scaler
        bounds = None if scaler is None else scaler.bounds(self.policy.scaling.target_outlier_std)
        low, high = ("?", "?") if bounds is None else (bounds[0].tolist(), bounds[1].tolist())
        log.warning(
            "%s: %d sample(s) with a target beyond %g standard deviations of the running "
            "target statistics (range %s to %s) were clipped to it and not learned "
            "(livefit_train_outliers_total; train.target_outlier_std)",
            self.name, samples, self.policy.scaling.target_outlier_std, low, high,
        )  # fmt: skip

    def _record(self, batch: Batch, learned: Learned, elapsed: float) -> None:
        series = self._series or self._labelled_series()
        series["steps"].inc(learned.steps)
        series["samples"].inc(len(batch))
        series["batch_size"].observe(len(batch))
        series["step_seconds"].observe(elapsed)
        series["loss"].set(learned.first.loss)
        scores = self.scores.scores
        series["prequential_loss"].set(scores["loss"].value)
        if "accuracy" in scores:
            series["prequential_accuracy"].set(scores["accuracy"].value)
        for metric, mean in scores.items():
            series[f"sliding {metric}"].set(mean.value)
            series[f"cumulative {metric}"].set(mean.cumulative)
        if learned.replayed:
            state = self.metrics.group(TrainingStateMetrics)
            state.replayed_samples.labels(model=self.name).inc(learned.replayed)
        if self.policy.replay is not None:
            series["replay_fill"].set(self.policy.replay.fill_ratio)
        series["version"].set(self.version)
        series["model_samples"].set(self.samples_seen)
        series["queue_depth"].set(len(self.queue))
        first = learned.first
        if first.expert_shares is not None and first.expert_errors is not None:
            for expert, share, error in zip(
                self.step.experts or (), first.expert_shares, first.expert_errors, strict=True
            ):
                series[f"expert_weight {expert}"].set(share)
                series[f"expert_error {expert}"].set(error)

    def _labelled_series(self) -> dict[str, Any]:
        """This model's series that ``_record`` updates every batch, looked up once
        (``labels()`` takes a lock and a dict lookup: 16 a batch cost about 30 us)."""
        m, name = self.metrics.group(TrainingMetrics), self.name
        state = self.metrics.group(TrainingStateMetrics)
        queue = self.metrics.group(SampleQueueMetrics)
        series: dict[str, Any] = {
            "steps": m.train_steps.labels(model=name),
            "samples": m.train_samples.labels(model=name),
            "batch_size": m.train_batch_size.labels(model=name),
            "step_seconds": m.train_step_seconds.labels(model=name),
            "loss": m.train_loss.labels(model=name),
            "prequential_loss": m.prequential_loss.labels(model=name),
            "version": state.model_version.labels(model=name),
            "model_samples": state.model_samples.labels(model=name),
            "queue_depth": queue.queue_depth.labels(model=name),
        }
        # Only the series the model has (created on first use, as before).
        if "accuracy" in self.scores.scores:
            series["prequential_accuracy"] = m.prequential_accuracy.labels(model=name)
        if self.policy.replay is not None:
            series["replay_fill"] = state.replay_fill.labels(model=name)
        for expert in self.step.experts or ():
            series[f"expert_weight {expert}"] = m.expert_weight.labels(model=name, expert=expert)
            series[f"expert_error {expert}"] = m.expert_error.labels(model=name, expert=expert)
        for metric in self.scores.scores:
            for window in ("sliding", "cumulative"):
                series[f"{window} {metric}"] = m.prequential_score.labels(
                    model=name, metric=metric, window=window
                )
        self._series = series
        return series

    def _snapshot(self, force: bool = False) -> Snapshot | None:
        """Hand a copy of the weights to the slot, at most every ``serve_interval_s``
        (stretched to ``_COPY_SHARE`` times the copy's cost) unless ``force``; returns the
        snapshot at the current version, or None when none was due."""
        if self._held is not None:
            self._hand_out(self._held)
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
            weights=tuple(self._served_step().served_weights()),
            created_at=time.time(),
            samples_seen=self.samples_seen,
            newest_published_at=self._newest_published_at,
            lineage=self.lineage,
        )
        self._copy_s = time.perf_counter() - started
        self._last_snapshot_at = now
        self._snapshot_version = self.version
        self._last_snapshot = snapshot
        self._hand_out(snapshot)
        return snapshot

    def _hand_out(self, snapshot: Snapshot) -> None:
        """Publish ``snapshot`` into the slot if its version is claimed on disk (``_claim``);
        else hold it back (the newest held wins) for ``_snapshot`` to try again."""
        if self._claim(snapshot.version):
            self._held = None
            self.slot.publish(snapshot)
        else:
            self._held = snapshot

    def _served_step(self) -> TrainStep:
        """The step whose model snapshots carry: the served candidate's (the configured one
        without selection); its averaged weights with ``train.weight_average``."""
        return self.step if self.candidates is None else self.candidates.served.policy.step

    # checkpoints and versions ------------------------------------------------------------------
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
        self._claimed = 0  # the version mark on disk: no snapshot above it leaves (_claim)
        self._mark_retry = Backoff(STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S)
        self._checkpoint_retry = Backoff(STORAGE_RETRY_FIRST_S, STORAGE_RETRY_MAX_S)

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
        # Versions up to the mark may have been handed out with weights other than these (a
        # crash after the checkpoint): continue above them. The checkpoint's own version, at or
        # above the mark (a clean stop), was handed out with exactly these weights, if at all.
        if checkpoint is not None and checkpoint.version >= mark:
            self.version = checkpoint.version
            self._durable_version = self.version  # a clean stop here needs no new checkpoint
            self._checkpoint_version = self.version
        elif mark == 0:  # nothing to continue: the new lineage (above) starts at 0, untrained
            self.version = self._checkpoint_version = 0
        else:  # these weights at a new number: worth a checkpoint of their own
            self.version, self._checkpoint_version = mark + 1, -1
        self._claimed = mark
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
            # continue right here instead of above the claimed block (no version jump).
            try:
                self.checkpoints.write_high_water_mark(self.version)
            except OSError as exc:  # the claimed mark stays: a restart jumps, never reuses
                self.storage.failed("version_mark", exc)
                return
            self._claimed = self.version
            if self._held is not None:  # the final snapshot, now covered: serving gets it
                self._hand_out(self._held)

    def _claim(self, version: int) -> bool:
        """Whether a snapshot at ``version`` may leave the trainer: the version mark on disk
        covers it, claiming the next block (``VERSION_BLOCK``) there first when it does not.

        A restart continues above the mark, so no version is ever handed out twice, even by a
        learner killed long after its last checkpoint (versions may jump instead). While the
        mark cannot be written the answer is no, tried again on a back-off.
        """
        if version <= self._claimed:
            return True
        if self.checkpoints is None:  # no storage: a new lineage per process, nothing to claim
            self._claimed = version + VERSION_BLOCK
            return True
        if not self._mark_retry.due():
            return False
        try:
            self.checkpoints.write_high_water_mark(version + VERSION_BLOCK)
        except OSError as exc:
            self.storage.failed("version_mark", exc)
            self._mark_retry.failed()
            return False
        self._claimed = version + VERSION_BLOCK
        self._mark_retry.succeeded()
        self.storage.recovered("version_mark")
        return True

    def _maybe_checkpoint(self, final: bool = False) -> None:
        """Copy the training state for the background writer (or write it now, when final):
        every ``checkpoint.interval_s`` when the version moved, and after a failed write on a
        back-off, at the same version too.

        A final call writes unless the checkpoint at this exact version is on disk or with the
        writer (which ``stop`` lets finish before recording the version)."""
        if self._writer is None:
            return
        if final:
            if self.version <= self._durable_version or (
                self.version == self._checkpoint_version and self._writer.failure is None
            ):
                return
        elif not self._checkpoint_due():
            return
        if self._writer.failure is not None:  # a retry: the next one waits longer
            self._checkpoint_retry.failed()
        started = time.perf_counter()
        snapshot = self._snapshot(force=True)  # the checkpoint reuses its copy of the weights
        if snapshot is None:  # cannot happen: a forced snapshot always exists
            raise RuntimeError(f"no snapshot of {self.name} v{self.version} to checkpoint")
        if self._served_step() is not self.step or self.step.serve_average:
            # Checkpoints keep the configured model's trained weights (its averaged ones, if
            # any, travel in the policy's extra arrays).
            weights = tuple(np.asarray(w) for w in self.model.get_weights())
            snapshot = replace(snapshot, weights=weights)
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


def _clear_async_error() -> None:
    """Clear this thread's TensorFlow executor's error state (an asynchronous executor fails
    every later call until then)."""
    from tensorflow.python.eager import context

    context.context().executor.clear_error()


@dataclass(slots=True)
class _Pending:
    """A batch the pipelined trainer has started and not finished."""

    started: Started
    batch: Batch  # as it came from the queue
    started_at: float  # perf_counter when it was taken


def pipelining(settings: ModelSettings, placement: Placement, serving_here: bool) -> bool:
    """Whether the trainer pipelines its steps (``train.pipeline``, see ``_run_pipelined``):
    never with several devices or model selection. "auto": where this process may use 2 or
    more CPUs (on one, the bookkeeping and the step only take turns: measured 25-30 % slower)
    and serves no predictions (a one-process learner's event loop would get the GIL less
    often: the pipelined trainer does its Python work while TensorFlow computes)."""
    mode = settings.train.pipeline
    if mode == "off" or settings.selection.enabled or placement.replicas > 1:
        return False
    return mode == "on" or (usable_cores() >= 2 and not serving_here)


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
