"""One trainer thread per model: queue -> dynamic minibatch -> prequential score -> train step.

The trainer owns its Keras model; no other thread touches it. ``Trainer`` takes the batches
(``batch_limit``: a fresh model's fast start), runs its thread's loop and gives way to queued
predictions; its parts, each in its own module, do the rest:

- ``accounting``: what a learned batch did, counted (version, samples, scores, metrics, logs);
- ``step_pipeline``: the next step started before the previous batch is finished
  (``train.pipeline``);
- ``snapshots``: the copies of the weights handed to serving and the weight stream;
- ``version_mark``: no snapshot leaves with a version the mark on disk does not cover;
- ``checkpointing``: the checkpoint restored at start, those taken while training and at stop,
  and how far back the write-ahead log must be kept (``log_needed_from``).

On stop it trains what was already accepted, hands over a final snapshot and writes a final
checkpoint. A step whose loss, gradients, predictions or new weights are not finite is rolled
back; outlying regression targets are clipped (``update_policy``) and counted. With online model
selection (``selection.enabled``) a ``CandidateSet`` trains every candidate on each batch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from queue import Empty, SimpleQueue

import numpy as np

from ..base.metrics import ErrorMetrics, Metrics
from ..config.model import ModelSettings
from ..ingest.metrics import SampleQueueMetrics
from ..ingest.sample_queue import QueueClosed, SampleQueue
from ..storage.checkpoint import Checkpoint, CheckpointStore, new_lineage_id
from ..storage.health import StorageHealth
from ..storage.metrics import StorageMetrics
from ..wire.samples import Batch
from ..wire.snapshot import SnapshotSlot
from .accounting import Accounting, Progress
from .checkpointing import Checkpointing
from .hooks import TrainerHooks
from .metrics import CheckpointMetrics, TrainingMetrics, TrainingStateMetrics
from .modeling import build_compiled, experts_rule, make_loss
from .placement import Placement, as_placement
from .prequential import PrequentialScores
from .selection import CandidateSet
from .snapshots import Snapshots
from .step_pipeline import Pending, StepPipeline, asynchronous_executor, pipelining
from .train_step import TrainStep
from .update_policy import UpdatePolicy
from .version_mark import VersionMark

log = logging.getLogger(__name__)
_POLL_S = 0.1
_GIVE_WAY_POLL_S = 0.0002
TRAINER_NICENESS = 5  # added to the trainer thread's OS niceness when it gives way to serving
# A fresh model's smallest batch while it starts (``Trainer.batch_limit``). Measured over 15
# streams and 4 model seeds, a first message of 25 learned in batches of 5, 5, 10 and 5
# against one of 25 (BENCHMARKS.md, learning quality): 1, 1, 2, 4, 8, 9 lost 15 % MAE on
# Planes2D and 2 points on Agrawal (a 1-sample step moves the network as far as a full one).
FAST_START_MIN_BATCH = 5


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
        self.checkpoints = checkpoints
        self.storage = storage or StorageHealth(metrics)
        self.mark = VersionMark(checkpoints, self.storage)
        # replaced by the checkpoint dir's own at a restore (Checkpointing.restore)
        self.progress = Progress(lineage=new_lineage_id())
        self.fast_start_samples = settings.resolved_fast_start_samples()
        scores = PrequentialScores(
            settings.prequential_window,
            classification="crossentropy" in settings.loss or "accuracy" in settings.metrics,
            sparse=settings.resolved_target_shape() == [],
        )
        self._thread: threading.Thread | None = None
        # An operator's rollbacks, taken between batches: (weights, source version, answer)
        self._start_over: SimpleQueue[tuple[list[np.ndarray], int, Future[int]]] = SimpleQueue()
        self.model = build_compiled(settings, placement)
        self.pipelined = pipelining(settings, placement, self.hooks.serving_here)
        self.thread_cpu_s = 0.0  # CPU time of the trainer's thread, set when it ends
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
        self.policy = UpdatePolicy(settings, self.step, seed=settings.seed)
        # Online model selection: more candidates beside this policy's model (selection.py)
        self.candidates = (
            CandidateSet(name, settings, self.policy, placement)
            if settings.selection.enabled
            else None
        )
        self.accounting = Accounting(
            name, self.progress, scores, self.policy, self.candidates, queue, self.hooks, metrics
        )
        # The policy reports drift to the accounting, which reads the policy (built first)
        self.policy.on_drift = self.accounting.found_drift
        # Runs the steps where ``pipelined`` (``_run_pipelined``); idle otherwise
        self.pipeline = StepPipeline(name, self.policy, self.accounting.account, self.hooks,
                                     metrics)  # fmt: skip
        self.snapshots = Snapshots(
            name, settings, self.progress, self.step, self.candidates, slot, self.mark
        )
        self.checkpointing = Checkpointing(
            name, settings, checkpoints, self.progress, self.policy, self.snapshots, self.mark,
            self.hooks, metrics, self.storage,
        )  # fmt: skip

    def warm_up(self) -> None:
        """Restore the newest checkpoint, compile the step, hand serving the first snapshot."""
        self.checkpointing.restore()
        self.step.warm_up()
        if self.candidates is not None:
            self.candidates.warm_up()
        self.snapshots.take_first()

    def start(self) -> None:
        self.checkpointing.start()
        if self.pipelined:
            log.info("%s: training steps pipelined (train.pipeline = %r)", self.name,
                     self.settings.train.pipeline)  # fmt: skip
        self._thread = threading.Thread(target=self._run, name=f"trainer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking samples, train what is queued, publish a final snapshot, join."""
        self.queue.close()
        stopped = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("trainer %s did not stop within %.0fs", self.name, timeout)
                stopped = False
            self._thread = None
        self.checkpointing.stop(stopped)

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
            self._between_batches()
        self._at_the_end()

    def _run_pipelined(self, max_wait_s: float, yield_s: float) -> None:
        """``_train_until_closed`` with the next plain batch's step started before the previous
        batch is finished (``train.pipeline``; how: ``StepPipeline``). Snapshots and
        checkpoints are taken between batches with nothing running."""
        pipeline = self.pipeline
        pending: Pending | None = None
        with asynchronous_executor():
            while True:
                full = self.settings.train.max_batch_size
                if pending is not None and (
                    (max_wait_s > 0 and len(self.queue) < full) or self.batch_limit() < full
                ):
                    # The next batch would linger (train.max_wait_ms) to fill up, or its size
                    # depends on what this one learns (the fast start, ``batch_limit``):
                    # finish this one first, as one batch after the other would.
                    pipeline.complete(pending)
                    pending = None
                    self._between_batches()
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
                        pending = pipeline.overlap(pending, batch)
                    except Exception:  # overlap catches its steps' own errors: a last net
                        pipeline.failed(batch)
                        pending = None
                elif pending is not None:  # nothing more arrived: finish what runs
                    pipeline.complete(pending)
                    pending = None
                if pending is not None and (self.snapshots.due() or self.checkpointing.due()):
                    pipeline.complete(pending)
                    pending = None
                if pending is None:
                    self._between_batches()
            pipeline.complete(pending)
            self._at_the_end()

    def _between_batches(self) -> None:
        """An operator's rollback, if one waits; a snapshot and a checkpoint, where due."""
        self._start_over_if_asked()
        self.snapshots.take()
        self.checkpointing.save_if_due()

    def continue_from(self, weights: list[np.ndarray], source: int, timeout: float) -> int:
        """Train on from ``weights`` (kept version ``source``) as a new version, the next
        number (no number ever names two sets of weights, so receivers take it as any newer
        version); returns that version once its snapshot is handed out. Runs on the trainer's
        thread between batches; TimeoutError when it did not get there within ``timeout``."""
        if self.candidates is not None:
            raise ValueError(
                f"model {self.name} selects among candidates: a rollback that trains on is not "
                "supported there; roll back with serving holding the version instead"
            )
        request: Future[int] = Future()
        self._start_over.put((weights, source, request))
        return request.result(timeout)

    def _start_over_if_asked(self) -> None:
        while True:
            try:
                weights, source, request = self._start_over.get_nowait()
            except Empty:
                return
            if not request.set_running_or_notify_cancel():
                continue
            try:
                self.policy.start_over_from(weights)
                self.progress.version += 1
                self.snapshots.take(force=True)
                log.warning("model %s: rolled back to v%d by the operator; training goes on "
                            "from it as v%d", self.name, source, self.progress.version)  # fmt: skip
                request.set_result(self.progress.version)
            except Exception as exc:  # the trainer goes on; the operator hears why
                request.set_exception(exc)

    def _at_the_end(self) -> None:
        """The final snapshot and checkpoint (none where the one at this version is on disk)."""
        self.snapshots.take(force=True)
        self.checkpointing.save_if_due(final=True)

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
        holds only those (not at version 0: an untrained model's first labels go at once); a
        batch cut short by the fast start counts as a full-size batch would (its ``backlog``:
        the samples a ``train.max_batch_size`` batch would have left), so that the fast start
        alone does not make it a batch taken from a backlog."""
        limit = self.batch_limit()
        joined_wait_s = self.settings.labels.batch_window_ms / 1000.0 if self.version else 0.0
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
        self.accounting.account(batch, learned, time.perf_counter() - started)

    # what the model has come to ------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.progress.version

    @property
    def samples_seen(self) -> int:
        return self.progress.samples_seen

    @property
    def trained_position(self) -> int:
        """The write-ahead-log position of the last message fully trained."""
        return self.progress.trained_position

    @property
    def lineage(self) -> str:
        return self.progress.lineage

    @property
    def scores(self) -> PrequentialScores:
        """The prequential scores each batch adds to (``Accounting``)."""
        return self.accounting.scores

    @scores.setter
    def scores(self, scores: PrequentialScores) -> None:
        self.accounting.scores = scores

    @property
    def restored_from(self) -> Checkpoint | None:
        """The checkpoint ``warm_up`` restored, if any."""
        return self.checkpointing.restored_from

    @property
    def log_needed_from(self) -> int:
        """The write-ahead-log position the log must be kept past
        (``Checkpointing.log_needed_from``)."""
        return self.checkpointing.log_needed_from

    def on_checkpoint(self, callback: Callable[[Checkpoint], None]) -> None:
        """Call ``callback(checkpoint)`` after each checkpoint is on disk (writer thread)."""
        self.checkpointing.on_checkpoint(callback)


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
