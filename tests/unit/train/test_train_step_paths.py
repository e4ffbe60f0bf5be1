"""The train step's fast call path (TensorFlow's internal flat call) computes exactly what the
public ``ConcreteFunction`` call computes, so a TensorFlow upgrade that changes it is caught."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from tensorflow.python.eager.polymorphic_function import polymorphic_function

from livefit.server.config.model import ModelSettings
from livefit.server.train.modeling import build_compiled, make_loss
from livefit.server.train.train_step import TrainStep


def step_pair() -> tuple[TrainStep, TrainStep]:
    settings = ModelSettings.model_validate(
        {"builder": "mlp", "input_shape": [3], "output_shape": [1], "seed": 5}
    )  # standardize scaling by default: five inputs
    steps = []
    for _ in range(2):
        keras.utils.clear_session()
        model = build_compiled(settings, "/CPU:0")
        step = TrainStep(model, make_loss(settings), [3], [1], "/CPU:0")
        step.warm_up()
        steps.append(step)
    return steps[0], steps[1]


def test_flat_and_public_calls_agree() -> None:
    fast, public = step_pair()
    assert fast._flat is not None  # this TensorFlow has the internal entry point
    public._flat = None
    rng = np.random.default_rng(0)
    for n in (1, 7, 64):
        x = rng.normal(size=(n, 3)).astype(np.float32)
        y = rng.normal(size=(n, 1)).astype(np.float32)
        w = np.ones(n, np.float32)
        stats = (np.full(3, 0.5, np.float32), np.full(3, 2.0, np.float32))
        a, b = fast(x, y, w, stats), public(x, y, w, stats)
        assert a.loss == b.loss and a.applied == b.applied
        np.testing.assert_array_equal(a.prequential_losses, b.prequential_losses)
        np.testing.assert_array_equal(a.predictions, b.predictions)
    for u, v in zip(fast.model.get_weights(), public.model.get_weights(), strict=True):
        np.testing.assert_array_equal(u, v)
    assert fast.traces == 1


@pytest.mark.parametrize("optimizer", ["nadam", "adam", "sgd", "rmsprop", "adagrad", "adafactor"])
def test_warming_up_runs_the_step_and_changes_nothing(optimizer: str) -> None:
    """``warm_up`` runs the step once at a NaN learning rate (so that its kernels exist before
    the first real batch), which the step rolls back: a step that has trained keeps its
    weights, optimizer state and rate, scaling statistics and average exactly, and the next
    step computes what it would have without the warm-up."""
    settings = ModelSettings.model_validate(
        {"builder": "mlp", "input_shape": [3], "output_shape": [1], "seed": 5,
         "optimizer": optimizer, "train": {"weight_average": 0.9}}
    )  # fmt: skip
    pair = []
    for _ in range(2):
        keras.utils.clear_session()
        model = build_compiled(settings, "/CPU:0")
        step = TrainStep(model, make_loss(settings), [3], [1], "/CPU:0", weight_average=0.9)
        step.warm_up()
        pair.append(step)
    warmed, control = pair
    assert not warmed.rewindable and warmed.averaging
    rng = np.random.default_rng(1)
    batches = [
        (rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32))
        for n in (5, 9, 3)
    ]
    stats = (np.full(3, 0.5, np.float32), np.full(3, 2.0, np.float32))
    for x, y in batches[:2]:
        for step in pair:
            step.learning_rate = 0.02
            assert step(x, y, np.ones(len(x), np.float32), stats).applied

    def state(step: TrainStep) -> list[np.ndarray]:
        return [
            *(np.asarray(v) for v in step.model.variables),
            *step.optimizer_state(),
            *step.average_state().values(),
        ]

    before = state(warmed)
    collected = []
    collect = warmed.collect
    warmed.collect = lambda dispatched: collected.append(collect(dispatched)) or collected[-1]
    warmed.warm_up()
    del warmed.collect
    assert [r.applied for r in collected] == [False]  # the step ran once, rolled back
    assert warmed.learning_rate == 0.02
    for u, v in zip(before, state(warmed), strict=True):
        np.testing.assert_array_equal(u, v)
    x, y = batches[2]
    a = warmed(x, y, np.ones(len(x), np.float32))
    b = control(x, y, np.ones(len(x), np.float32))
    assert a.applied and a.loss == b.loss
    np.testing.assert_array_equal(a.predictions, b.predictions)
    for u, v in zip(state(warmed), state(control), strict=True):
        np.testing.assert_array_equal(u, v)
    assert warmed.traces == 1


def test_warming_up_a_step_whose_rate_is_a_schedule_skips_the_run() -> None:
    """A learning-rate schedule is not an input of the step: no NaN rate to roll back with, so
    ``warm_up`` only traces (the first batch builds the kernels) and the weights stay."""
    settings = ModelSettings.model_validate(
        {"builder": "mlp", "input_shape": [3], "output_shape": [1], "seed": 5}
    )
    keras.utils.clear_session()
    model = build_compiled(settings, "/CPU:0")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 100, 0.9)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    step = TrainStep(model, make_loss(settings), [3], [1], "/CPU:0")
    assert step.learning_rate is None
    weights = model.get_weights()
    step.warm_up()
    for u, v in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(u, v)
    assert int(np.asarray(model.optimizer.iterations)) == 0


def test_warm_up_calls_every_function_through_its_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner of several models traces each model's functions once; called through
    ``tf.function``'s own call, those traces of one code were counted as retracing and logged
    as a warning from the fifth model on. Through their traces they are counted nowhere."""
    counted: list[object] = []
    monkeypatch.setattr(
        type(polymorphic_function._frequent_tracing_detector_manager),
        "called_with_tracing",
        lambda self, key, function, omit: counted.append(function),
    )
    settings = ModelSettings.model_validate(
        {"input_shape": [3], "output_shape": [1], "train": {"weight_average": 0.9}}
    )
    step = TrainStep(build_compiled(settings, "/CPU:0"), make_loss(settings), [3], [1],
                     "/CPU:0", weight_average=0.9, rewindable=True)  # fmt: skip
    step.warm_up()
    step(*(np.ones((2, n), np.float32) for n in (3, 1)), np.ones(2, np.float32))
    step.rewind()
    step.reset_average()
    assert counted == []
