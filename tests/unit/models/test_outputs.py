"""Outputs that fit the loss: built-in builders end classifiers in sigmoid or softmax (trained on
the logits), served predictions and prequential scores are probabilities, combinations that
cannot train are config errors naming both keys, and custom builders are warned about."""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import pytest

from livefit.models.builders import build_model, output_activation_name
from livefit.models.names import BUILTIN_BUILDERS
from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.config.settings import ConfigError, load_settings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.serve.serving import ServingModel
from livefit.server.train.modeling import build_compiled, build_uncompiled
from livefit.server.train.trainer import Trainer
from livefit.server.wire.samples import Batch
from livefit.server.wire.snapshot import SnapshotSlot
from tests.step_pool import pooled_steps

SHAPES = {"linear": [3], "mlp": [3], "lstm": [4, 3]}


def settings(**overrides: Any) -> ModelSettings:
    """A model table as a user writes it: shapes and the loss (and a seed, for the test)."""
    return ModelSettings.model_validate(
        {"input_shape": [3], "output_shape": [1], "seed": 0, **overrides}
    )


def trainer(**overrides: Any) -> Trainer:
    with pooled_steps():
        instance = Trainer("m", settings(**overrides), SampleQueue(10_000), SnapshotSlot(),
                           Metrics(), "/CPU:0")  # fmt: skip
    instance.warm_up()
    return instance


def batch(x: np.ndarray, y: np.ndarray) -> Batch:
    n = len(x)
    return Batch(x.astype(np.float32), y.astype(np.float32), np.ones(n, np.float32), 1, None, None)


@pytest.mark.parametrize("builder", BUILTIN_BUILDERS)
@pytest.mark.parametrize(
    ("loss", "output_shape", "expected"),
    [
        ("binary_crossentropy", [1], "sigmoid"),
        ("BinaryCrossentropy", [3], "sigmoid"),  # multi-label
        ("categorical_crossentropy", [4], "softmax"),
        ("sparse_categorical_crossentropy", [4], "softmax"),
        ("SparseCategoricalCrossentropy", [4], "softmax"),
        ("mse", [1], "linear"),
        ("hinge", [1], "linear"),
    ],
)
def test_builtin_output_follows_the_loss(
    builder: str, loss: str, output_shape: list[int], expected: str
) -> None:
    model = build_model(builder, SHAPES[builder], output_shape, seed=0, loss=loss)
    assert output_activation_name(model) == expected
    configured = build_uncompiled(
        settings(builder=builder, input_shape=SHAPES[builder], output_shape=output_shape,
                 loss=loss), "/CPU:0",
    )  # fmt: skip
    assert output_activation_name(configured) == expected


def test_an_explicit_fitting_activation_is_kept() -> None:
    model = build_model(
        "mlp", [3], [1], {"output_activation": "sigmoid"}, loss="binary_crossentropy"
    )
    assert output_activation_name(model) == "sigmoid"


def test_softmax_normalises_each_row_of_a_rank_two_output() -> None:
    model = build_model("lstm", [4, 3], [2, 5], seed=0, loss="categorical_crossentropy")
    out = np.asarray(model(np.random.default_rng(0).normal(size=(6, 4, 3)).astype(np.float32)))
    assert out.shape == (6, 2, 5)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"builder_options": {"output_activation": "linear"}, "loss": "binary_crossentropy"},
         ("builder_options.output_activation", "'linear'", "loss", "binary_crossentropy")),
        ({"builder_options": {"output_activation": "relu"}, "loss": "binary_crossentropy"},
         ("builder_options.output_activation", "'relu'", "loss")),
        ({"builder": "linear", "builder_options": {"output_activation": "sigmoid"},
          "output_shape": [3], "loss": "categorical_crossentropy"},
         ("builder_options.output_activation", "'sigmoid'", "categorical_crossentropy")),
        ({"builder_options": {"output_activation": "softmax"}},
         ("builder_options.output_activation", "softmax", "output_shape [1]")),
        ({"loss": "sparse_categorical_crossentropy"},
         ("sparse_categorical_crossentropy", "output_shape [1]")),
        ({"loss": "binary_crossentropy", "target_scaling": "standardize"},
         ("target_scaling", "standardize", "loss", "binary_crossentropy")),
        ({"loss": "poisson", "target_scaling": "standardize"}, ("target_scaling", "poisson")),
    ],
)  # fmt: skip
def test_a_combination_that_cannot_train_is_a_config_error_naming_both_keys(
    tmp_path: Any, table: dict[str, Any], named: tuple[str, ...]
) -> None:
    lines = ['builder = "mlp"', "input_shape = [3]", "output_shape = [1]"]
    for key, value in table.items():
        if isinstance(value, dict):
            inner = ", ".join(f'{k} = "{v}"' for k, v in value.items())
            lines.append(f"{key} = {{{inner}}}")
        elif isinstance(value, list):
            lines = [line for line in lines if not line.startswith(f"{key} =")]
            lines.append(f"{key} = {value}")
        else:
            lines = [line for line in lines if not line.startswith(f"{key} =")]
            lines.append(f'{key} = "{value}"')
    path = tmp_path / "livefit.toml"
    path.write_text("[models.demo]\n" + "\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path, environ={})
    message = str(error.value)
    assert "models.demo" in message
    for part in named:
        assert part in message, message


def test_build_model_refuses_what_the_config_refuses() -> None:
    with pytest.raises(ValueError, match=r"output_activation = 'linear'.*binary_crossentropy"):
        build_model("mlp", [3], [1], {"output_activation": "linear"}, loss="binary_crossentropy")


@pytest.mark.parametrize("experts", [False, True])
def test_saturated_wrong_sigmoid_keeps_its_gradient(experts: bool) -> None:
    """Keras computes the cross-entropy of a sigmoid output from its logits: a confident wrong
    prediction gets the loss of its logit (not -log(1e-7) = 16.1 from clipping) and a step
    that moves it. A linear output under the same loss would be clipped and not move. With
    experts the network fits its own output, so its step moves it the same way (the served
    mixture of probabilities has no logits: its score is that of the mixture)."""
    t = trainer(loss="binary_crossentropy", experts={"enabled": experts})
    output = t.model.get_layer("mlp").get_layer("output")
    output.bias.assign(np.full((1,), 40.0, np.float32))  # p(1) = 1 - 4e-18 for every input
    x = np.random.default_rng(0).normal(size=(25, 3))
    before = output.bias.numpy()
    result = t.step(x.astype(np.float32), np.zeros((25, 1), np.float32), np.ones(25, np.float32))
    assert result.applied
    if not experts:
        assert result.prequential_losses.min() > 30  # the logit's loss, not clipped at 16.1
    assert output.bias.numpy()[0] < before[0] - 1e-3  # the step moved it


def test_predictions_served_and_scored_are_probabilities() -> None:
    t = trainer(output_shape=[4], loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 4))
    for _ in range(20):
        x = rng.normal(size=(25, 3))
        t.train_batch(batch(x, (x @ w).argmax(axis=1)))
    scores = t.scores.scores
    assert 0.5 < scores["accuracy"].cumulative <= 1.0
    assert 0.0 < scores["log_loss"].cumulative < np.log(4)  # better than a uniform guess
    t.snapshots.take(force=True)
    snapshot = t.slot.latest
    assert snapshot is not None
    serving = ServingModel("m", build_uncompiled(t.settings, "/CPU:0"), [3], [1, 8],
                           lambda: snapshot, "/CPU:0")  # fmt: skip
    rows = rng.normal(size=(5, 3)).astype(np.float32)
    outputs, version = serving.predict(rows)
    assert version == t.version
    assert outputs.shape == (5, 4) and (outputs >= 0).all()
    np.testing.assert_allclose(outputs.sum(axis=1), 1.0, rtol=1e-5)
    # The serving model pads 5 rows to its batch size of 8: other GEMM shapes, other float32
    # rounding (1.4e-6 relative seen on an AVX-512 CPU), so equal up to float32 precision.
    # The weights served: the trained ones, or their average (train.weight_average).
    served = build_uncompiled(t.settings, "/CPU:0")
    served.set_weights(t.step.served_weights())
    np.testing.assert_allclose(outputs, np.asarray(served(rows)), rtol=1e-5, atol=1e-7)


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize(
    ("builder", "loss", "warned"),
    [
        ("tests.custom_builder:build", "binary_crossentropy", "output activation is 'linear'"),
        ("tests.custom_builder:build", "mse", None),
        ("tests.unit.models.test_outputs:sigmoid_builder", "binary_crossentropy", None),
        ("tests.unit.models.test_outputs:sigmoid_builder", "mse", "bounded"),
    ],
)
def test_custom_builder_whose_output_does_not_fit_the_loss_is_warned_about(
    builder: str, loss: str, warned: str | None
) -> None:
    recorder = _Recorder()
    logger = logging.getLogger("livefit.server.train.modeling")
    logger.addHandler(recorder)
    try:
        build_compiled(settings(builder=builder, input_shape=[5], output_shape=[1], loss=loss),
                       "/CPU:0")  # fmt: skip
    finally:
        logger.removeHandler(recorder)
    if warned is None:
        assert recorder.messages == []
    else:
        assert len(recorder.messages) == 1 and warned in recorder.messages[0]
        assert builder in recorder.messages[0] and loss in recorder.messages[0]


def sigmoid_builder(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> keras.Model:
    """A custom builder whose output is a probability (referenced by the test above)."""
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(output_shape[0], activation="sigmoid")(x))
