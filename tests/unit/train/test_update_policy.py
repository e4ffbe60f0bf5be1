"""The trainer's update policy with a real Keras model: scaling statistics, replay composition,
steps per batch, drift detection and reactions, and scaler state across checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from livefit.models.standardize import standardize_layer
from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import Batch
from livefit.server.wire.snapshot import SnapshotSlot
from tests.step_pool import pooled_steps


def trainer(
    tmp_path: Path | None = None, drifts: list[int] | None = None, **overrides: Any
) -> Trainer:
    settings = ModelSettings.model_validate(
        {"builder": "linear", "input_shape": [3], "output_shape": [1], "seed": 0, **overrides}
    )
    store = CheckpointStore(tmp_path, "m") if tmp_path is not None else None
    hooks = TrainerHooks()
    if drifts is not None:
        hooks.drift_detected = drifts.append  # type: ignore[method-assign]
    with pooled_steps():
        instance = Trainer("m", settings, SampleQueue(10_000), SnapshotSlot(), Metrics(), "/CPU:0",
                           store, hooks)  # fmt: skip
    instance.warm_up()
    return instance


def batch(x: np.ndarray, y: np.ndarray | None = None, backlog: int = 0) -> Batch:
    n = len(x)
    targets = y if y is not None else x.sum(axis=1, keepdims=True)
    return Batch(
        x.astype(np.float32), targets.astype(np.float32), np.ones(n, np.float32), 1, None, None,
        backlog=backlog,
    )  # fmt: skip


def step_sizes(t: Trainer) -> list[int]:
    """From now on, the number of rows of every training step ``t`` takes, in order."""
    seen: list[int] = []
    original = t.step.__class__.dispatch  # every step starts there (a plain one only there)

    def spy(self: Any, x: np.ndarray, *rest: Any) -> Any:
        seen.append(len(x))
        return original(self, x, *rest)

    t.step.__class__ = type("Spy", (t.step.__class__,), {"dispatch": spy})
    return seen


def test_scaling_statistics_match_a_direct_computation() -> None:
    t = trainer()
    rng = np.random.default_rng(0)
    seen = []
    for size in (1, 7, 64, 3, 200):
        x = rng.normal(loc=[100.0, -5.0, 0.0], scale=[10.0, 0.1, 3.0], size=(size, 3))
        seen.append(x)
        t.train_batch(batch(x))
    layer = standardize_layer(t.model)
    assert layer is not None
    everything = np.concatenate(seen)
    np.testing.assert_allclose(np.asarray(layer.mean), everything.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(layer.std), everything.std(axis=0), rtol=1e-4)
    names = [v.path for v in t.model.weights]
    assert names[:2] == ["standardize/mean", "standardize/std"]  # in every snapshot


def test_no_scaling_layer_when_off() -> None:
    assert standardize_layer(trainer(scaling="none").model) is None


def test_replay_composition_and_bound() -> None:
    t = trainer(train={"replay_capacity": 50, "replay_share": 0.5, "steps_per_batch": 2})
    rng = np.random.default_rng(1)
    t.train_batch(batch(rng.normal(size=(20, 3))))  # nothing to replay yet
    assert t.policy.replay is not None and len(t.policy.replay) == 20
    seen_shapes = step_sizes(t)
    before = t.version
    t.train_batch(batch(rng.normal(size=(10, 3))))
    assert seen_shapes == [20, 20]  # 10 new + 10 replayed (share 0.5), twice (2 steps)
    assert t.version == before + 2
    for _ in range(20):
        t.train_batch(batch(rng.normal(size=(10, 3))))
    assert len(t.policy.replay) == 50  # bounded
    assert t.metrics.registry.get_sample_value("livefit_replayed_samples_total", {"model": "m"}) > 0


@pytest.mark.parametrize(
    ("overrides", "capacity"),
    [({}, 2000), ({"loss": "binary_crossentropy"}, 500), ({"train": {"replay_capacity": 0}}, 0),
     ({"loss": "binary_crossentropy", "train": {"replay_capacity": 3000}}, 3000)],
)  # fmt: skip
def test_the_replay_buffer_holds_the_loss_default_or_the_set_capacity(
    overrides: dict[str, Any], capacity: int
) -> None:
    """Unset, a regression model replays from its last 2,000 samples and a classifier from its
    last 500; a set capacity wins (0: no buffer). Filled past it, the buffer stays there."""
    t = trainer(**overrides)
    if capacity == 0:
        assert t.policy.replay is None
        return
    assert t.policy.replay is not None and t.policy.replay.capacity == capacity
    rng = np.random.default_rng(2)
    for _ in range(capacity // 250 + 2):
        x = rng.normal(size=(250, 3))
        t.train_batch(batch(x, (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)))
    assert len(t.policy.replay) == capacity


@pytest.mark.parametrize("extras_when", ["caught_up", "always"])
def test_extra_steps_and_replay_only_when_caught_up(extras_when: str) -> None:
    t = trainer(
        train={"replay_capacity": 100, "replay_share": 0.75, "steps_per_batch": 2,
               "extras_when": extras_when}
    )  # fmt: skip
    rng = np.random.default_rng(4)
    t.train_batch(batch(rng.normal(size=(40, 3))))  # fills the buffer (nothing to replay yet)
    sizes = step_sizes(t)
    before = t.version
    t.train_batch(batch(rng.normal(size=(10, 3)), backlog=0))  # took every queued sample
    assert sizes == [40, 40]  # 10 new + 30 replayed (share 0.75), two steps
    assert t.version == before + 2
    sizes.clear()
    t.train_batch(batch(rng.normal(size=(10, 3)), backlog=500))  # taken from a backlog
    if extras_when == "caught_up":
        assert sizes == [10]  # one plain step on the batch's own samples
        assert t.version == before + 3
    else:
        assert sizes == [40, 40]
        assert t.version == before + 4
    assert t.policy.replay is not None and len(t.policy.replay) == 60  # both batches joined


def test_no_extra_steps_while_predictions_wait() -> None:
    t = trainer(train={"replay_capacity": 100, "replay_share": 0.75, "steps_per_batch": 2})
    rng = np.random.default_rng(6)
    t.train_batch(batch(rng.normal(size=(40, 3))))
    sizes = step_sizes(t)
    busy = [True]
    t.hooks.predictions_waiting = lambda: busy[0]  # type: ignore[method-assign]
    t.train_batch(batch(rng.normal(size=(10, 3))))
    assert sizes == [10]  # requests queued: one plain step, predictions go first
    busy[0] = False
    t.train_batch(batch(rng.normal(size=(10, 3))))
    assert sizes == [10, 40, 40]


def test_the_queue_says_how_much_a_batch_left_behind() -> None:
    from livefit.server.wire.samples import SampleChunk

    queue = SampleQueue(1000)
    x = np.zeros((100, 3), np.float32)
    queue.put(SampleChunk(x, np.zeros((100, 1), np.float32), np.ones(100, np.float32)))
    first = queue.next_batch(30)
    assert first is not None and len(first) == 30 and first.backlog == 70
    rest = queue.next_batch(256)
    assert rest is not None and len(rest) == 70 and rest.backlog == 0


@pytest.mark.parametrize("reaction", ["reset_optimizer", "boost_lr", "recover"])
def test_drift_reactions(reaction: str) -> None:
    t = trainer(
        learning_rate=0.01,
        drift={"reaction": reaction, "boost_steps": 3},
        train={"start_lr_factor": 1, "steps_per_batch": 2},
    )
    t.train_batch(batch(np.ones((4, 3))))
    t.policy.drift._detector.update = lambda losses: [0]  # type: ignore[method-assign]
    t.train_batch(batch(np.ones((4, 3))))
    optimizer = t.model.optimizer
    if reaction == "reset_optimizer":
        fresh = type(optimizer).from_config(optimizer.get_config())
        fresh.build(t.step.optimized)
        for live, new in zip(optimizer.variables, fresh.variables, strict=True):
            np.testing.assert_array_equal(np.asarray(live), np.asarray(new), err_msg=live.path)
        assert t.policy.rate.current == pytest.approx(0.01)
    elif reaction == "boost_lr":
        assert t.policy.rate.current == pytest.approx(0.03)
        t.policy.drift = None
        for _ in range(3):
            t.train_batch(batch(np.ones((4, 3))))
        assert t.policy.rate.current == pytest.approx(0.01)
    else:  # recover: 3x, then decaying linearly: 3 steps of 2 per batch (caught up)
        assert t.policy.rate.current == pytest.approx(0.03)
        t.policy.drift = None
        t.train_batch(batch(np.ones((4, 3))))
        assert t.policy.rate.current == pytest.approx(0.01 * (1 + 2 / 3))
        t.train_batch(batch(np.ones((4, 3))))
        assert t.policy.rate.current == pytest.approx(0.01)


def test_a_reset_optimizer_keeps_learning() -> None:
    """After the reset the model still learns: the learning rate is not zeroed with the rest."""
    t = trainer(learning_rate=0.05, drift={"reaction": "reset_optimizer"})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    t.train_batch(batch(x))
    t.policy.drift._detector.update = lambda losses: [0]  # type: ignore[method-assign]
    t.train_batch(batch(x))
    t.policy.drift = None
    before = t.model.get_weights()
    for _ in range(5):
        t.train_batch(batch(x))
    moved = max(
        float(np.abs(a - b).max()) for a, b in zip(before, t.model.get_weights(), strict=True)
    )
    assert moved > 1e-4


@pytest.mark.parametrize("reaction", ["flush_replay", "recover"])
def test_drift_reactions_that_empty_the_replay_buffer(reaction: str) -> None:
    t = trainer(drift={"reaction": reaction}, train={"replay_capacity": 100, "replay_share": 0.5})
    t.train_batch(batch(np.ones((20, 3))))
    assert t.policy.replay is not None and len(t.policy.replay) == 20
    t.policy.drift._detector.update = lambda losses: [0]  # type: ignore[method-assign]
    t.train_batch(batch(np.ones((5, 3))))
    assert len(t.policy.replay) == 5  # emptied on drift; the drifting batch joined after


def test_a_fresh_model_starts_with_a_decaying_learning_rate_boost() -> None:
    t = trainer(learning_rate=0.01, train={"start_lr_factor": 4.0, "start_steps": 3})
    assert t.policy.rate.current == pytest.approx(0.04)
    rates = []
    for _ in range(3):
        t.train_batch(batch(np.ones((4, 3)), backlog=1))  # one step a batch
        rates.append(t.policy.rate.current)
    assert rates == pytest.approx([0.03, 0.02, 0.01])
    t.train_batch(batch(np.ones((4, 3)), backlog=1))
    assert t.policy.rate.current == pytest.approx(0.01)


def test_each_step_runs_at_the_rate_the_policy_set_for_it() -> None:
    """The rate is an input of the compiled step: the optimizer's variable holds the rate of
    the step just run, and the update is made with it (plain SGD: a 4x rate moves the weights
    4x as far on the same first batch, and the decayed rate of the next steps likewise). The
    network's weights: the linear expert learns at its own rate (``experts``)."""
    x = np.random.default_rng(1).normal(size=(8, 3))
    moves = {}
    for factor in (1.0, 4.0):
        t = trainer(
            optimizer="sgd", learning_rate=0.01, target_scaling="none", scaling="none",
            train={"start_lr_factor": factor, "start_steps": 2, "weight_average": 0},
        )  # fmt: skip
        network = t.step.optimized
        before = [np.array(v.numpy()) for v in network]
        expected = t.policy.rate.current
        t.train_batch(batch(x, backlog=1))
        assert float(np.asarray(t.model.optimizer.learning_rate)) == pytest.approx(expected)
        moves[factor] = float(
            sum(np.abs(v.numpy() - b).sum() for v, b in zip(network, before, strict=True))
        )
        assert t.policy.rate.current == pytest.approx(0.01 * (1 + (factor - 1) / 2))
        t.train_batch(batch(x, backlog=1))
        assert float(np.asarray(t.model.optimizer.learning_rate)) == pytest.approx(
            0.01 * (1 + (factor - 1) / 2)
        )
    assert moves[4.0] == pytest.approx(4 * moves[1.0], rel=1e-4)


def test_no_start_boost_by_setting_or_after_a_restore(tmp_path: Path) -> None:
    plain = trainer(learning_rate=0.01, train={"start_lr_factor": 1.0})
    assert plain.policy.rate.current == pytest.approx(0.01)
    t = trainer(tmp_path, learning_rate=0.01, train={"start_lr_factor": 4.0})
    t.train_batch(batch(np.ones((4, 3))))
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path, learning_rate=0.01, train={"start_lr_factor": 4.0})
    assert restored.policy.rate.factor == 1.0
    assert restored.policy.rate.current == pytest.approx(0.01)


def test_the_same_seed_repeats_a_run() -> None:
    """``seed`` covers the initial weights, the replay sampling and the backend's random ops:
    two trainers with the same seed fed the same batches predict the same, to the bit."""
    rng = np.random.default_rng(5)
    batches = [rng.normal(size=(25, 3)) for _ in range(8)]
    runs = []
    for seed in (11, 11, 12):
        t = trainer(builder="mlp", seed=seed, train={"replay_capacity": 50})
        for x in batches:
            t.train_batch(batch(x, np.sin(x).sum(axis=1, keepdims=True)))
        runs.append(np.asarray(t.model(batches[0].astype(np.float32))))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_scaler_state_survives_a_checkpoint(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    x = np.random.default_rng(3).normal(loc=50, scale=4, size=(100, 3))
    t.train_batch(batch(x))
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path)
    assert (
        restored.policy.scaling.scaler is not None and restored.policy.scaling.scaler.count == 100
    )
    np.testing.assert_allclose(
        np.asarray(standardize_layer(restored.model).mean), x.mean(axis=0), rtol=1e-5
    )
