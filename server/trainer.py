"""One trainer thread per model: queue -> dynamic minibatch -> prequential score -> train step.

The trainer owns its Keras model; no other thread touches it. Every ``publish_interval_s``
(and only when the weights changed) it copies them into a ``Snapshot`` for everything
downstream. On stop it trains what was already accepted, then hands over a final snapshot.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from livefit.server.config import ModelSettings
from livefit.server.metrics import Metrics
from livefit.server.modeling import build_compiled, make_loss
from livefit.server.prequential import WindowedMean, correct_predictions
from livefit.server.samples import Batch, QueueClosed, SampleQueue
from livefit.server.snapshot import Snapshot, SnapshotSlot
from livefit.server.train_step import TrainStep

log = logging.getLogger(__name__)
_POLL_S = 0.1


class Trainer:
    """Trains model ``name`` from ``queue`` and publishes snapshots into ``slot``."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        queue: SampleQueue,
        slot: SnapshotSlot,
        metrics: Metrics,
        device: str,
    ) -> None:
        self.name = name
        self.settings = settings
        self.queue = queue
        self.slot = slot
        self.metrics = metrics
        self.device = device
        self.version = 0
        self.samples_seen = 0
        self.prequential_loss = WindowedMean(settings.prequential_window)
        self.prequential_accuracy = WindowedMean(settings.prequential_window)
        self._track_accuracy = "accuracy" in settings.metrics
        self._sparse_targets = settings.resolved_target_shape() == []
        self._newest_published_at: float | None = None
        self._last_snapshot_at = 0.0
        self._snapshot_version = -1
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

    def warm_up(self) -> None:
        """Compile the step and hand serving the initial weights (version 0)."""
        self.step.warm_up()
        self._snapshot(force=True)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"trainer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking samples, train what is queued, publish a final snapshot, join."""
        self._stopping.set()
        self.queue.close()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("trainer %s did not stop within %.0fs", self.name, timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        train = self.settings.train
        max_wait_s = train.max_wait_ms / 1000.0
        while True:
            try:
                batch = self.queue.next_batch(train.max_batch_size, max_wait_s, timeout=_POLL_S)
            except QueueClosed:
                break
            if batch is not None:
                self._train_safely(batch)
            self._snapshot()
        self._snapshot(force=True)

    def _train_safely(self, batch: Batch) -> None:
        try:
            self.train_batch(batch)
        except Exception:
            # A failing step must not kill the trainer: count it, log it, keep going.
            self.metrics.internal_errors.labels(component="trainer").inc()
            log.exception("training step failed for %s (batch of %d)", self.name, len(batch))

    def train_batch(self, batch: Batch) -> None:
        """Score ``batch`` with the current weights, then train on it (one version step)."""
        started = time.perf_counter()
        result = self.step(batch.x, batch.y, batch.w)
        elapsed = time.perf_counter() - started
        self.version += 1
        self.samples_seen += len(batch)
        if batch.newest_published_at is not None:
            self._newest_published_at = max(
                batch.newest_published_at, self._newest_published_at or 0.0
            )
        self.prequential_loss.add(result.prequential_losses)
        if self._track_accuracy:
            self.prequential_accuracy.add(
                correct_predictions(batch.y, result.predictions, self._sparse_targets)
            )
        self._record(batch, result.loss, elapsed)

    def _record(self, batch: Batch, loss: float, elapsed: float) -> None:
        m, name = self.metrics, self.name
        m.train_steps.labels(model=name).inc()
        m.train_samples.labels(model=name).inc(len(batch))
        m.train_batch_size.labels(model=name).observe(len(batch))
        m.train_step_seconds.labels(model=name).observe(elapsed)
        m.train_loss.labels(model=name).set(loss)
        m.prequential_loss.labels(model=name).set(self.prequential_loss.value)
        if self._track_accuracy:
            m.prequential_accuracy.labels(model=name).set(self.prequential_accuracy.value)
        m.model_version.labels(model=name).set(self.version)
        m.queue_depth.labels(model=name).set(len(self.queue))

    def _snapshot(self, force: bool = False) -> None:
        now = time.monotonic()
        interval = self.settings.weights.publish_interval_s
        if self.version == self._snapshot_version:
            return
        if not force and now - self._last_snapshot_at < interval:
            return
        snapshot = Snapshot(
            model=self.name,
            version=self.version,
            weights=tuple(np.asarray(w) for w in self.model.get_weights()),
            created_at=time.time(),
            samples_seen=self.samples_seen,
            newest_published_at=self._newest_published_at,
        )
        self._last_snapshot_at = now
        self._snapshot_version = self.version
        self.slot.publish(snapshot)
