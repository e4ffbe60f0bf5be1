"""The trainer gives way to queued prediction requests, for a bounded time, and says so."""

from __future__ import annotations

import threading
import time

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.metrics import TrainingMetrics
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import SampleChunk
from livefit.server.wire.snapshot import SnapshotSlot


def run_trainer(yield_ms: float, busy_for_s: float) -> tuple[Trainer, float, float]:
    """Train 5 single-sample messages while "serving" is busy for ``busy_for_s``."""
    settings = ModelSettings.model_validate(
        {"builder": "linear", "input_shape": [2], "output_shape": [1], "seed": 0,
         "train": {"yield_to_serving_ms": yield_ms, "max_batch_size": 1}}
    )  # fmt: skip
    busy_until = time.monotonic() + busy_for_s
    queue = SampleQueue(100)
    metrics = Metrics()

    class Busy(TrainerHooks):
        def predictions_waiting(self) -> bool:
            return time.monotonic() < busy_until

    trainer = Trainer("m", settings, queue, SnapshotSlot(), metrics, "/CPU:0", hooks=Busy())
    trainer.warm_up()
    for i in range(5):
        x = np.full((1, 2), i, np.float32)
        queue.put(SampleChunk(x, np.ones((1, 1), np.float32), np.ones(1, np.float32)))
    started = time.monotonic()
    trainer.start()
    trainer.stop()
    waited = metrics.group(TrainingMetrics).train_yield_seconds.labels(model="m")._value.get()
    return trainer, waited, time.monotonic() - started


def test_trainer_waits_while_predictions_are_queued_but_never_more_than_the_limit() -> None:
    trainer, waited, _ = run_trainer(yield_ms=20, busy_for_s=60)
    assert trainer.samples_seen == 5  # serving busy all along: training still goes on
    assert 5 * 0.02 <= waited < 5 * 0.02 + 1.0  # 20 ms before each of the 5 steps


def test_trainer_does_not_wait_when_told_not_to() -> None:
    trainer, waited, _ = run_trainer(yield_ms=0, busy_for_s=60)
    assert trainer.samples_seen == 5 and waited == 0


def test_trainer_thread_runs_at_lower_priority_when_giving_way() -> None:
    import os

    seen: list[int] = []
    original = Trainer._run

    def spy(self: Trainer) -> None:
        original(self)
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    Trainer._run = spy  # type: ignore[method-assign]
    try:
        run_trainer(yield_ms=1, busy_for_s=0)
    finally:
        Trainer._run = original  # type: ignore[method-assign]
    assert seen and seen[0] >= os.getpriority(os.PRIO_PROCESS, 0) + 5
