"""The experts' parts of the compiled step (``step_graph.ExpertsGraph``): the linear expert's
plain SGD on the batch's new rows, the mixture's move, and what a step leaves alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tensorflow.python.autograph.impl import api as autograph_api

from livefit.models.experts import experts_view, linear_expert_model, mixture_layer
from livefit.server.config.model import ModelSettings
from livefit.server.train.modeling import build_compiled, experts_rule, make_loss
from livefit.server.train.step_graph import ERROR_CAP
from livefit.server.train.train_step import TrainStep


def step_of(**overrides: Any) -> TrainStep:
    config: dict[str, Any] = {
        "input_shape": [3], "output_shape": [1], "seed": 3, "optimizer": "sgd",
        "learning_rate": 0.01, "train": {"weight_average": 0.0}, **overrides,
    }  # fmt: skip
    settings = ModelSettings.model_validate(config)
    model = build_compiled(settings, "/CPU:0")
    step = TrainStep(model, make_loss(settings), settings.input_shape,
                     settings.resolved_target_shape(), "/CPU:0",
                     experts=experts_rule(settings))  # fmt: skip
    step.warm_up()
    return step


def arrays(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 3.0).astype(np.float32)
    return x, y, np.ones(rows, np.float32)


def stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return values.mean(axis=0).astype(np.float32), values.std(axis=0).astype(np.float32) + 1


def test_the_linear_expert_takes_per_sample_sized_sgd_steps_on_the_new_rows() -> None:
    """Its update is ``rate`` times the summed gradient of the new rows (up to
    ``linear_rows`` of them), on inputs standardized with the statistics after the batch, to
    targets standardized likewise: River's per-sample SGD, each sample's gradient taken at the
    weights before the batch. Replayed rows after them teach it nothing."""
    step = step_of(experts={"linear_rows": 4})
    linear = linear_expert_model(step.model)
    assert linear is not None
    kernel, bias = (np.array(v.numpy()) for v in linear.trainable_variables)
    kernel += np.float32(0.1)  # away from zero, so that the gradient depends on it
    linear.trainable_variables[0].assign(kernel)
    x, y, w = arrays(10)
    fresh = 6  # rows 6..9 stand for replayed samples
    input_stats, target_stats = stats(x), stats(y)
    result = step(x, y, w, input_stats, target_stats, fresh_rows=fresh)
    assert result.applied
    xs = (x[:fresh] - input_stats[0]) / input_stats[1]
    ts = (y[:fresh] - target_stats[0]) / target_stats[1]
    error = xs @ kernel + bias - ts  # d(mse)/d(prediction) is 2 * error
    scale = min(fresh, 4) / fresh
    rate = min(0.01, 1 / 3)
    expected_kernel = kernel - rate * scale * (xs.T @ (2 * error))
    expected_bias = bias - rate * scale * (2 * error).sum(axis=0)
    new_kernel, new_bias = (v.numpy() for v in linear.trainable_variables)
    np.testing.assert_allclose(new_kernel, expected_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_bias, expected_bias, rtol=1e-5, atol=1e-6)


def test_the_mixture_follows_the_experts_discounted_errors() -> None:
    """After a step: recent errors = before * decay**rows + this batch's (absolute errors of
    the standardized outputs, pre-update), shares = softmax(-rate * recent errors)."""
    step = step_of(experts={"decay": 0.9, "rate": 2.0})
    mixture = mixture_layer(step.model)
    view = experts_view(step.model)
    assert mixture is not None and view is not None
    x, y, w = arrays(8, seed=1)
    target_stats = stats(y)
    for _ in range(3):
        before = mixture.recent_error.numpy().copy()
        samples = mixture.recent_samples.numpy().copy()
        network, linear, _ = (np.asarray(t) for t in view(x))
        target = (y - target_stats[0]) / target_stats[1]
        errors = np.array([np.abs(network - target).sum(), np.abs(linear - target).sum()])
        result = step(x, y, w, stats(x), target_stats)
        recent = before * 0.9**8 + errors
        np.testing.assert_allclose(mixture.recent_error.numpy(), recent, rtol=1e-4)
        np.testing.assert_allclose(mixture.recent_samples.numpy(), samples * 0.9**8 + 8, rtol=1e-5)
        shares = np.exp(-2.0 * (recent - recent.min()))
        np.testing.assert_allclose(mixture.share.numpy(), shares / shares.sum(), rtol=1e-4)
        assert result.expert_shares is not None and result.expert_errors is not None
        np.testing.assert_allclose(result.expert_shares, mixture.share.numpy(), rtol=1e-6)
        np.testing.assert_allclose(result.expert_errors, recent / (samples * 0.9**8 + 8),
                                   rtol=1e-4)  # fmt: skip


def test_a_step_on_no_new_rows_moves_neither_the_linear_expert_nor_the_mixture() -> None:
    step = step_of()
    x, y, w = arrays(8)
    step(x, y, w, stats(x), stats(y))
    linear = linear_expert_model(step.model)
    mixture = mixture_layer(step.model)
    assert linear is not None and mixture is not None
    kept = [v.numpy().copy() for v in (*linear.weights, *mixture.weights)]
    network = [v.numpy().copy() for v in step.optimized]
    result = step(x, y, w, fresh_rows=0)  # a batch's later step: replayed rows, scored none
    assert result.applied
    for v, old in zip((*linear.weights, *mixture.weights), kept, strict=True):
        np.testing.assert_array_equal(v.numpy(), old)
    assert any(not np.array_equal(v.numpy(), old) for v, old in zip(step.optimized, network,
                                                                    strict=True))  # fmt: skip


def test_a_linear_expert_that_cannot_step_leaves_the_network_learning() -> None:
    """A linear gradient that is not finite keeps the linear expert's weights; the network's
    step still applies (the whole step rolls back only for the network's own reasons, or
    where the served mixture itself is not finite), and its one sample's error counts at most
    ``ERROR_CAP``, so that the expert can win its share back."""
    step = step_of()
    linear = linear_expert_model(step.model)
    mixture = mixture_layer(step.model)
    assert linear is not None and mixture is not None
    linear.trainable_variables[1].assign(np.full((1,), 3e38, np.float32))  # finite outputs
    mixture.share.assign(np.array([1.0, 0.0], np.float32))  # the mixture finite too
    kept = [v.numpy().copy() for v in linear.trainable_variables]
    network = [v.numpy().copy() for v in step.optimized]
    x, y, w = arrays(8)
    result = step(x, y, w, stats(x), stats(y))  # the summed gradient overflows
    assert result.applied
    for v, old in zip(linear.trainable_variables, kept, strict=True):
        np.testing.assert_array_equal(v.numpy(), old)
    assert any(not np.array_equal(v.numpy(), o) for v, o in zip(step.optimized, network,
                                                                strict=True))  # fmt: skip
    recent = mixture.recent_error.numpy()
    assert np.all(np.isfinite(recent)) and recent[1] == pytest.approx(8 * ERROR_CAP)


def test_a_checkpoint_from_before_experts_restores_the_network() -> None:
    """A learner upgraded to experts restores its network and optimizer from a checkpoint
    written without them; the linear expert and the mixture start afresh."""
    plain = step_of(experts={"enabled": False})
    x, y, w = arrays(16)
    plain(x, y, w, stats(x), stats(y))
    step = step_of()
    fresh_linear = [v.numpy().copy() for v in linear_expert_model(step.model).weights]
    step.restore(plain.model.get_weights(), plain.optimizer_state())
    for v, old in zip(linear_expert_model(step.model).weights, fresh_linear, strict=True):
        np.testing.assert_array_equal(v.numpy(), old)
    network = step.model.get_layer("mlp").get_weights()
    for a, b in zip(network, plain.model.get_layer("mlp").get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(step.model.get_layer("standardize").get_weights()[0],
                                  plain.model.get_layer("standardize").get_weights()[0])  # fmt: skip
    with pytest.raises(ValueError):
        step.restore(plain.model.get_weights()[:-1], plain.optimizer_state())


def test_the_step_is_traced_without_autograph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every function of the step uses ``tf.cond`` where it branches on a tensor, so it is
    traced as written: autograph's conversion of them cost 1.4 s of each learner's start."""
    converted: list[object] = []
    real = autograph_api.converted_call

    def counting(function: object, *args: Any, **kwargs: Any) -> object:
        converted.append(function)
        return real(function, *args, **kwargs)

    monkeypatch.setattr(autograph_api, "converted_call", counting)
    settings = ModelSettings.model_validate(
        {"input_shape": [3], "output_shape": [1], "train": {"weight_average": 0.99}}
    )
    model = build_compiled(settings, "/CPU:0")
    step = TrainStep(model, make_loss(settings), settings.input_shape,
                     settings.resolved_target_shape(), "/CPU:0", weight_average=0.99,
                     rewindable=True, experts=experts_rule(settings))  # fmt: skip
    step.warm_up()  # the step, the rewind, its copies and the average's restart
    step(*arrays(4))
    assert step.traces == 1
    assert converted == []
