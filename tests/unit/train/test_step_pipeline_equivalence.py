"""The pipelined trainer (``train.pipeline``): a batch is finished before the next one lingers,
and warming up a rewindable step changes nothing; what the streams share with
``tests/learning/train/test_step_pipeline_equivalence.py`` (a warmed-up trainer with samples
queued, the streams, the comparison of two trainers' states).

The pipeline starts the next plain batch's step before the previous batch is finished,
assuming that step applies and brings no drift reaction; where it did not, it rewinds the early
step and the update policy and starts the batch again.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import SampleChunk
from livefit.server.wire.snapshot import SnapshotSlot

CHUNK = 16  # rows a message carries; batches of 32 take two


def _trainer(
    settings: dict[str, Any], x: np.ndarray, y: np.ndarray, hooks: TrainerHooks | None = None
) -> Trainer:
    """A warmed-up trainer of ``settings`` with ``x``, ``y`` queued in messages of CHUNK."""
    model = ModelSettings.model_validate(
        {"input_shape": [x.shape[1]], "output_shape": [y.shape[1]], "seed": 3, **settings}
    )
    queue = SampleQueue(len(x) + 1)
    trainer = Trainer("m", model, queue, SnapshotSlot(), Metrics(), "/CPU:0", hooks=hooks)
    trainer.warm_up()
    for start in range(0, len(x), CHUNK):
        rows = slice(start, start + CHUNK)
        queue.put(SampleChunk(x[rows], y[rows], np.ones(len(x[rows]), np.float32), None, None))
    return trainer


def _assert_same(plain: dict[str, Any], piped: dict[str, Any]) -> None:
    for key, value in plain.items():
        if isinstance(value, list):
            assert len(value) == len(piped[key]), key
            for a, b in zip(value, piped[key], strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=key)
        else:
            assert value == piped[key] or (value != value and piped[key] != piped[key]), key


def _regression_stream(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A linear target that switches concept twice (drift), moves to a new level (a level
    shift), has lone outlying targets (clipped) and a few rows of NaN inputs (their batches'
    steps are rolled back)."""
    n = 6_000
    x = rng.normal(size=(n, 4)).astype(np.float32)
    w = np.where(np.arange(n)[:, None] < 2_000, [1.0, -2.0, 0.5, 0.0], [-3.0, 1.0, 0.0, 2.0])
    y = (x * w).sum(axis=1, keepdims=True) + rng.normal(0, 0.1, (n, 1))
    y[4_000:] += 40.0  # a new level
    y[rng.integers(500, n, 6)] = 1e6  # lone outliers
    x[rng.integers(300, n, 5)] = np.nan  # rolled-back batches
    return x, y.astype(np.float32)


def _classification_stream(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = 6_000
    x = rng.normal(size=(n, 5)).astype(np.float32)
    boundary = np.where(np.arange(n) < 3_000, x[:, 0] + x[:, 1], x[:, 2] - x[:, 0])
    y = (boundary > 0).astype(np.float32)[:, None]
    x[rng.integers(300, n, 4)] = np.nan
    return x, y


def test_a_batch_is_finished_before_the_next_one_lingers() -> None:
    """With ``train.max_wait_ms`` the next batch may wait to fill up; the batch before it is
    finished first (its version, scores and snapshot), not after the wait."""
    x, y = _classification_stream(np.random.default_rng(3))
    x, y = np.nan_to_num(x)[:74], y[:74]  # two full batches of 32, then 10 rows that linger
    settings = {
        "loss": "binary_crossentropy",
        # full batches from the first sample: no fast start
        "train": {
            "max_batch_size": 32,
            "pipeline": "on",
            "max_wait_ms": 30_000,
            "fast_start_samples": 0,
        },
        "weights": {"serve_interval_s": 60},  # no snapshot due to finish it meanwhile
    }
    trainer = _trainer(settings, x, y)
    trainer.start()
    try:
        deadline = time.monotonic() + 15.0  # the linger is 30 s: reaching 64 means no wait
        while trainer.samples_seen < 64 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trainer.samples_seen == 64
    finally:
        trainer.stop(timeout=60)
    assert trainer.samples_seen == 74


def test_warming_up_a_rewindable_step_changes_nothing() -> None:
    """``TrainStep.warm_up`` runs the rewind once (its first run builds kernels: 30 ms, paid
    by the first drift's rewind before), after copying what it restores, and the average's
    restart, then puts the average back: nothing moves, even where the rewind's copies held
    older values (here, the state before the last step)."""
    x, y = _regression_stream(np.random.default_rng(5))
    x, y = np.nan_to_num(x)[:96], y[:96]
    settings = {"loss": "mse", "builder_options": {"dropout": 0.2},
                "train": {"max_batch_size": 32, "pipeline": "on"}}  # fmt: skip
    trainer = _trainer(settings, x, y)
    step = trainer.step
    assert step.rewindable and step.averaging
    for start in (0, 32, 64):
        rows = slice(start, start + 32)
        assert step(x[rows], y[rows], np.ones(32, np.float32)).applied

    def state() -> dict[str, Any]:  # what the rewind restores (the policy is not involved)
        return {
            "variables": [np.asarray(v) for v in trainer.model.variables],
            "optimizer": step.optimizer_state(),
            "average": list(step.average_state().values()),
        }

    before = state()
    step.warm_up()
    _assert_same(before, state())
    # and the rewind itself still undoes a step
    result = step(x[:32], y[:32], np.ones(32, np.float32))
    assert result.applied
    step.rewind()
    _assert_same(before, state())
    # the restart (a drift reaction) still restarts the average from the trained weights
    step.reset_average()
    trained = [np.asarray(v) for v in trainer.model.trainable_variables]
    for average, weights in zip(step.average_state().values(), trained, strict=False):
        np.testing.assert_array_equal(average, weights)
    assert step.average_state()["average_steps"] == 0
