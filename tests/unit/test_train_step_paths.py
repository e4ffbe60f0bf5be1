"""The train step's fast call path (TensorFlow's internal flat call) computes exactly what the
public ``ConcreteFunction`` call computes, so a TensorFlow upgrade that changes it is caught."""

from __future__ import annotations

import keras
import numpy as np

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
