"""Online target standardization: regression losses train on standardized targets, the model maps
its output back to the user's units with statistics that live in its weights (so serving copies,
snapshots and checkpoints carry them), and every reported score stays in the user's units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from livefit.models.builders import build_model, weight_names
from livefit.models.standardize import standardize_layer
from livefit.models.target_scaling import TARGET_SCALING_LAYER, target_scaling_layer
from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.serve.serving import ServingModel
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.train.modeling import build_uncompiled
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import Batch
from livefit.server.wire.snapshot import SnapshotSlot
from tests.step_pool import pooled_steps

W = np.array([[1.0], [-2.0], [0.5]])


def settings(**overrides: Any) -> ModelSettings:
    """A regression model as a user writes it: the shapes (and a seed, for the test)."""
    return ModelSettings.model_validate(
        {"input_shape": [3], "output_shape": [1], "seed": 0, **overrides}
    )


def trainer(tmp_path: Path | None = None, **overrides: Any) -> Trainer:
    store = CheckpointStore(tmp_path, "m") if tmp_path is not None else None
    with pooled_steps():
        instance = Trainer("m", settings(**overrides), SampleQueue(10_000), SnapshotSlot(),
                           Metrics(), "/CPU:0", store)  # fmt: skip
    instance.warm_up()
    return instance


def batch(x: np.ndarray, y: np.ndarray) -> Batch:
    n = len(x)
    return Batch(x.astype(np.float32), y.astype(np.float32), np.ones(n, np.float32), 1, None, None)


def stream(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Targets far from zero: 5000 + 100 * (a linear function), with noise of 10."""
    x = rng.normal(size=(n, 3))
    return x, 5000.0 + 100.0 * (x @ W) + rng.normal(scale=10.0, size=(n, 1))


@pytest.mark.parametrize(
    ("loss", "expected"),
    [("mse", "standardize"), ("mae", "standardize"), ("huber", "standardize"),
     ("MeanSquaredError", "standardize"), ("binary_crossentropy", "none"), ("poisson", "none"),
     ("msle", "none")],
)  # fmt: skip
def test_regression_losses_standardize_their_targets_by_default(loss: str, expected: str) -> None:
    s = settings(loss=loss)
    assert s.target_scaling is None and s.resolved_target_scaling() == expected
    has_layer = target_scaling_layer(build_uncompiled(s, "/CPU:0")) is not None
    assert has_layer == (expected == "standardize")
    off = settings(loss=loss, target_scaling="none")
    assert target_scaling_layer(build_uncompiled(off, "/CPU:0")) is None


def test_statistics_match_a_direct_computation_and_travel_in_the_weights() -> None:
    """Only new samples count, once each, with replay and several steps per batch (the
    defaults: four for this regression model)."""
    t = trainer()
    assert t.policy.replay is not None and t.policy.replay.capacity == 2000
    assert t.policy.steps_per_batch == 4
    rng = np.random.default_rng(1)
    seen = []
    for size in (1, 7, 64, 3, 200, 25, 25):
        x, y = stream(rng, size)
        seen.append(y)
        t.train_batch(batch(x, y))
    targets = np.concatenate(seen)
    layer = target_scaling_layer(t.model)
    assert layer is not None and t.policy.scaling.target_scaler is not None
    assert t.policy.scaling.target_scaler.count == len(targets)
    np.testing.assert_allclose(layer.mean.numpy(), targets.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(layer.std.numpy(), targets.std(axis=0), rtol=1e-5)
    names = weight_names(t.model)
    assert names[-2:] == [f"{TARGET_SCALING_LAYER}/mean", f"{TARGET_SCALING_LAYER}/std"]
    assert names[:2] == ["standardize/mean", "standardize/std"]  # input scaling still there
    assert standardize_layer(t.model) is not None
    t.snapshots.take(force=True)
    snapshot = t.slot.latest
    assert snapshot is not None
    np.testing.assert_allclose(snapshot.weights[-2], targets.mean(axis=0), rtol=1e-6)


def test_serving_copies_predict_in_the_users_units() -> None:
    t = trainer(train={"weight_average": 0.0})  # the trained weights served: t.model predicts
    rng = np.random.default_rng(2)
    for _ in range(60):
        t.train_batch(batch(*stream(rng, 25)))
    t.snapshots.take(force=True)
    snapshot = t.slot.latest
    assert snapshot is not None
    serving = ServingModel("m", build_uncompiled(t.settings, "/CPU:0"), [3], [1, 16],
                           lambda: snapshot, "/CPU:0")  # fmt: skip
    x, y = stream(rng, 16)
    served, _ = serving.predict(x.astype(np.float32))
    np.testing.assert_allclose(served, np.asarray(t.model(x.astype(np.float32))), rtol=1e-6)
    assert np.abs(served - y).mean() < 60  # in the targets' units, around 5000
    # A WeightSubscriber's model: build_model with the learner's settings takes the weights.
    replica = build_model("mlp", [3], [1], seed=5, scaling="standardize", loss="mse", experts=True)
    assert weight_names(replica) == weight_names(t.model)
    replica.set_weights(list(snapshot.weights))
    np.testing.assert_allclose(np.asarray(replica(x.astype(np.float32))), served, rtol=1e-6)


def test_losses_and_scores_are_in_the_users_units() -> None:
    t = trainer(train={"replay_capacity": 0})
    rng = np.random.default_rng(3)
    for _ in range(5):
        t.train_batch(batch(*stream(rng, 25)))
    x, y = stream(rng, 25)
    result = t.step(x.astype(np.float32), y.astype(np.float32), np.ones(25, np.float32))
    squared = ((result.predictions - y) ** 2).reshape(-1)
    np.testing.assert_allclose(result.prequential_losses, squared, rtol=1e-4, atol=1e-2)
    assert result.loss == pytest.approx(squared.mean(), rel=1e-4)
    assert result.predictions.mean() > 1000  # the user's units, not standardized ones


def test_target_statistics_survive_a_checkpoint(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    x, y = stream(np.random.default_rng(4), 100)
    t.train_batch(batch(x, y))
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path)
    assert restored.policy.scaling.target_scaler is not None
    assert restored.policy.scaling.target_scaler.count == 100
    layer = target_scaling_layer(restored.model)
    assert layer is not None
    np.testing.assert_allclose(layer.mean.numpy(), y.mean(axis=0), rtol=1e-6)


def test_a_rolled_back_step_keeps_the_target_statistics() -> None:
    t = trainer(builder="linear", optimizer="adam")
    rng = np.random.default_rng(5)
    t.train_batch(batch(*stream(rng, 25)))
    layer = target_scaling_layer(t.model)
    assert layer is not None and t.policy.scaling.target_scaler is not None
    mean, count = layer.mean.numpy(), t.policy.scaling.target_scaler.count
    _, y = stream(rng, 8)
    t.train_batch(batch(np.full((8, 3), 3e38), y))  # the loss overflows: rolled back
    np.testing.assert_array_equal(layer.mean.numpy(), mean)
    assert t.policy.scaling.target_scaler.count == count
    t.train_batch(batch(*stream(rng, 25)))
    assert t.policy.scaling.target_scaler.count == count + 25


@pytest.mark.parametrize("batches_before", [1, 8])  # 25 targets: a bound 4x as wide; 200
def test_an_outlying_target_is_clipped_counted_and_scored_against_its_bound(
    batches_before: int,
) -> None:
    t = trainer(builder="linear")
    rng = np.random.default_rng(6)
    for _ in range(batches_before):
        t.train_batch(batch(*stream(rng, 25)))
    scaler = t.policy.scaling.target_scaler
    assert scaler is not None
    bounds = scaler.bounds(t.settings.train.target_outlier_std)
    assert bounds is not None
    x, y = stream(rng, 25)
    y[3] = 1e9
    t.train_batch(batch(x, y))
    registry = t.metrics.registry
    assert registry.get_sample_value("livefit_train_outliers_total", {"model": "m"}) == 1
    assert not registry.get_sample_value("livefit_train_nonfinite_total", {"model": "m"})
    assert t.samples_seen == 25 * batches_before + 25  # trained, with its target clipped
    assert scaler.mean is not None and abs(scaler.mean[0] - 5000.0) < 200.0
    # scored against the bound it was clipped to, not 1e9
    mae = t.scores.scores["mae"]
    assert np.isfinite(mae.value) and mae.value < bounds[1][0] - 5000.0
    for _ in range(10):
        t.train_batch(batch(*stream(rng, 25)))
    prediction = float(t.model(np.zeros((1, 3), np.float32)).numpy()[0, 0])
    assert abs(prediction - 5000.0) < 200.0, prediction


def test_without_a_bound_a_target_that_overflows_the_loss_is_rolled_back_and_counted() -> None:
    t = trainer(builder="linear", train={"target_outlier_std": 0})
    rng = np.random.default_rng(7)
    for _ in range(8):
        t.train_batch(batch(*stream(rng, 25)))
    scaler = t.policy.scaling.target_scaler
    assert scaler is not None
    weights, count, version = t.model.get_weights(), scaler.count, t.version
    x, y = stream(rng, 25)
    y[3] = 3e38  # standardized it fits; in the user's units its loss is infinite
    t.train_batch(batch(x, y))
    registry = t.metrics.registry
    assert registry.get_sample_value("livefit_train_nonfinite_total", {"model": "m"}) == 1
    assert not registry.get_sample_value("livefit_train_outliers_total", {"model": "m"})
    assert (
        t.policy.scaling.target_scaler is not None and t.policy.scaling.target_scaler.count == count
    )
    assert t.version == version
    for before, after in zip(weights, t.model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)
    assert np.isfinite(t.scores.scores["loss"].value)
