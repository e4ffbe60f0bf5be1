"""A step whose loss, gradients or new weights are not finite is rolled back and counted."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import Batch
from livefit.server.wire.snapshot import SnapshotSlot
from tests.step_pool import pooled_steps


def trainer(optimizer: str = "adam", learning_rate: float = 0.01) -> Trainer:
    settings = ModelSettings.model_validate(
        {"builder": "linear", "input_shape": [4], "output_shape": [1], "seed": 0,
         "optimizer": optimizer, "learning_rate": learning_rate}
    )  # fmt: skip
    with pooled_steps():
        instance = Trainer("m", settings, SampleQueue(100), SnapshotSlot(), Metrics(), "/CPU:0")
    instance.warm_up()
    return instance


def batch(x: np.ndarray) -> Batch:
    n = x.shape[0]
    return Batch(
        x.astype(np.float32), np.ones((n, 1), np.float32), np.ones(n, np.float32), 1, None, None
    )


def state(t: Trainer) -> list[np.ndarray]:
    return [np.array(v) for v in t.model.get_weights()] + t.step.optimizer_state()


@pytest.mark.parametrize(
    ("optimizer", "learning_rate", "x"),
    [
        ("adam", 0.01, np.full((8, 4), 3e38)),  # the loss overflows to infinity
        ("sgd", 3e38, np.full((8, 4), 10.0)),  # finite gradients, but the update overflows
    ],
)
def test_bad_step_is_rolled_back(optimizer: str, learning_rate: float, x: np.ndarray) -> None:
    t = trainer(optimizer, learning_rate)
    count = "livefit_train_nonfinite_total"
    t.train_batch(batch(np.random.default_rng(0).normal(size=(8, 4)) * 1e-3))
    before, version = state(t), t.version
    rolled_back = t.metrics.registry.get_sample_value(count, {"model": "m"}) or 0
    t.train_batch(batch(x))
    after = state(t)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert t.version == version
    assert t.metrics.registry.get_sample_value(count, {"model": "m"}) == rolled_back + 1
    assert all(np.isfinite(w).all() for w in t.model.get_weights())
    if optimizer == "adam":  # (sgd at lr 3e38 cannot take a sane step at all)
        t.train_batch(batch(np.random.default_rng(1).normal(size=(8, 4))))
        assert t.version == version + t.policy.steps_per_batch  # training goes on
