"""Compiled shapes stay bounded whatever batch sizes arrive: the trainer's step is traced once."""

from __future__ import annotations

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import Batch
from livefit.server.wire.snapshot import SnapshotSlot

SIZES = (1, 3, 17, 64, 5, 255, 256, 2, 100)


def test_train_step_is_traced_once() -> None:
    settings = ModelSettings.model_validate(
        {"builder": "mlp", "input_shape": [6], "output_shape": [2]}
    )
    trainer = Trainer("m", settings, SampleQueue(10), SnapshotSlot(), Metrics(), "/CPU:0")
    trainer.warm_up()
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = rng.normal(size=(n, 6)).astype(np.float32)
        trainer.train_batch(Batch(x, x[:, :2].copy(), np.ones(n, np.float32), 1, None, None))
    assert trainer.step.traces == 1
