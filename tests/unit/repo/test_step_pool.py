"""``tests/step_pool.py``: a trainer given a pooled step starts exactly as a freshly built one,
whatever the step's earlier trainer did to it and whatever its loop's own settings; two trainers
of one test never share a step."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.train.trainer import Trainer
from livefit.server.wire.snapshot import SnapshotSlot
from tests import step_pool
from tests.step_pool import pooled_steps
from tests.unit.train.test_update_policy import batch

SETTINGS = ModelSettings.model_validate(
    {"builder": "mlp", "input_shape": [3], "output_shape": [1], "seed": 5,
     "train": {"weight_average": 0.9, "replay_capacity": 20, "replay_share": 0.5},
     "drift": {"reaction": "reset_optimizer"}}
)  # fmt: skip
# The same model and step, another loop: replay, drift reaction, checkpoints, batching
OTHER_LOOP = SETTINGS.model_validate(
    SETTINGS.model_dump()
    | {"train": SETTINGS.train.model_dump() | {"replay_capacity": 50, "replay_share": 0.75,
                                                "max_batch_size": 4},
       "drift": {"reaction": "flush_replay"}, "checkpoint": {"interval_s": 5.0},
       "labels": {"batch_window_ms": 0.0}}
)  # fmt: skip


def build(
    pooled: bool, directory: Path | None = None, settings: ModelSettings = SETTINGS
) -> Trainer:
    store = CheckpointStore(directory, "m") if directory is not None else None
    args = ("m", settings, SampleQueue(1000), SnapshotSlot(), Metrics(), "/CPU:0", store)
    if pooled:
        with pooled_steps():
            t = Trainer(*args)
    else:
        t = Trainer(*args)
    t.warm_up()
    return t


def state(t: Trainer) -> list[np.ndarray]:
    """Every variable of the model, its optimizer and the step's own (averages, copies)."""
    sv = t.step._variables
    groups = [t.model.variables, t.model.optimizer.variables, sv.state, sv.backup, sv.averages,
              [sv.averaged], sv.others, sv.others_backup, [v for p in sv.copies for v in p]]  # fmt: skip
    return [np.array(v.numpy()) for group in groups for v in group]


def learn(t: Trainer, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    for _ in range(3):
        t.train_batch(batch(rng.normal(size=(8, 3)), backlog=1))
    snapshot = t.snapshots.take(force=True)
    assert snapshot is not None
    return [*state(t), *snapshot.weights, np.array(t.step.serve_average)]


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_reused_step_starts_and_learns_as_a_fresh_one(tmp_path: Path) -> None:
    fresh = build(pooled=False, settings=OTHER_LOOP)
    started = state(fresh)
    learned = learn(fresh, 1)
    used = build(pooled=True)
    learn(used, 2)  # moves the weights, the optimizer, the average, the rewind copies
    used.step.serve_average = not used.step.serve_average
    used.step.__class__ = type("Spy", (used.step.__class__,), {})
    step_pool.release_all()  # as at the end of a test
    step_pool.activate()
    again = build(pooled=True, directory=tmp_path, settings=OTHER_LOOP)
    assert again.step is used.step and again.model is used.model  # it was reused
    assert type(again.step) is type(fresh.step)
    assert_same(state(again), started)
    assert_same(learn(again, 1), learned)


def test_two_trainers_of_one_test_get_two_steps() -> None:
    a, b = build(pooled=True), build(pooled=True)
    assert a.step is not b.step and a.model is not b.model
    before = state(b)
    learn(a, 3)
    assert_same(state(b), before)


def test_settings_that_reach_the_model_or_the_step_keep_steps_apart() -> None:
    key = step_pool.model_and_step_settings
    assert key(OTHER_LOOP) == key(SETTINGS)
    for change in ({"seed": 6}, {"optimizer": "adam"}, {"learning_rate": 0.02},
                   {"train": SETTINGS.train.model_dump() | {"weight_average": 0.5}},
                   {"experts": {"enabled": False}}, {"scaling": "none"}):  # fmt: skip
        assert key(SETTINGS.model_validate(SETTINGS.model_dump() | change)) != key(SETTINGS)
    assert set(step_pool.LOOP_ONLY) <= set(ModelSettings.model_fields)
    assert set(step_pool.STEP_TRAIN_FIELDS) <= set(type(SETTINGS.train).model_fields)
