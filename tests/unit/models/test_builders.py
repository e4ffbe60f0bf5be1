"""Contract checks generated for every model builder (River's test_estimators, for networks).

Each case must build with its declared shapes, learn a noisy linear stream, round-trip its
weights exactly, and give the same initial weights and weight names for the same seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import pytest

from livefit.models.builders import build_model, weight_names
from livefit.models.names import BUILTIN_BUILDERS

CUSTOM = "tests.custom_builder:build"
BATCH_SIZE = 32


@dataclass(frozen=True)
class Case:
    """One builder with the shapes and options a contract check builds it with."""

    builder: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        shapes = f"{'x'.join(map(str, self.input_shape))}-{'x'.join(map(str, self.output_shape))}"
        return f"{self.builder.rsplit(':', 1)[0]}-{shapes}"

    def build(self, seed: int | None = None) -> keras.Model:
        return build_model(self.builder, self.input_shape, self.output_shape, self.options, seed)


CASES = [
    Case("linear", (5,), (3,)),
    Case("linear", (2, 4), (2, 3)),
    Case("mlp", (6,), (2,), {"hidden_units": [32, 32]}),
    Case("mlp", (2, 4), (2, 3), {"hidden_units": [32], "dropout": 0.1}),
    Case("lstm", (4, 3), (2,)),
    Case("lstm", (4, 3), (2, 2), {"layers": 2}),
    Case(CUSTOM, (5,), (2, 2)),
]
cases = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])


class LinearStream:
    """Samples of a fixed random linear function of the inputs plus small noise (seeded)."""

    def __init__(self, case: Case, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self._in_shape, self._out_shape = case.input_shape, case.output_shape
        n_in, n_out = math.prod(case.input_shape), math.prod(case.output_shape)
        self._w = self._rng.normal(0.0, 1.0 / math.sqrt(n_in), (n_in, n_out))

    def batch(self, size: int = BATCH_SIZE) -> tuple[np.ndarray, np.ndarray]:
        x = self._rng.normal(size=(size, *self._in_shape))
        y = x.reshape(size, -1) @ self._w + self._rng.normal(0.0, 0.01, (size, self._w.shape[1]))
        return x.astype("float32"), y.reshape(size, *self._out_shape).astype("float32")


def _mse(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((np.asarray(model(x, training=False)) - y) ** 2))


def _assert_same_weights(a: keras.Model, b: keras.Model) -> None:
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)


def test_every_builtin_has_a_case() -> None:
    assert set(BUILTIN_BUILDERS) <= {c.builder for c in CASES}


@cases
def test_builds_with_declared_shapes(case: Case) -> None:
    model = case.build(seed=0)
    assert isinstance(model, keras.Model)
    assert tuple(model.inputs[0].shape) == (None, *case.input_shape)
    assert tuple(model.outputs[0].shape) == (None, *case.output_shape)
    assert model.outputs[0].dtype == "float32"
    assert not model.compiled  # uncompiled: the trainer chooses loss and optimizer
    x, _ = LinearStream(case).batch(3)
    assert np.asarray(model(x, training=False)).shape == (3, *case.output_shape)


@cases
def test_weights_round_trip_exactly(case: Case) -> None:
    source, target = case.build(seed=1), case.build(seed=2)
    source.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    stream = LinearStream(case)
    for _ in range(3):  # move the weights away from any initial value
        source.train_on_batch(*stream.batch())
    target.set_weights(source.get_weights())
    x, _ = stream.batch(16)
    np.testing.assert_array_equal(
        np.asarray(source(x, training=False)), np.asarray(target(x, training=False))
    )


@cases
def test_same_seed_gives_same_initial_weights(case: Case) -> None:
    _assert_same_weights(case.build(seed=7), case.build(seed=7))
    first, other = case.build(seed=7), case.build(seed=8)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(first.get_weights(), other.get_weights(), strict=True)
    )


@cases
def test_weight_names_are_unique_and_stable(case: Case) -> None:
    first, second = case.build(seed=0), case.build(seed=0)
    names = weight_names(first)
    assert len(names) == len(first.weights) > 0
    assert len(set(names)) == len(names)
    assert names == weight_names(second)


def test_mlp_options_shape_the_network() -> None:
    model = build_model("mlp", [4], [1], {"hidden_units": [8, 4, 2], "activation": "tanh"})
    assert [layer.name for layer in model.layers if layer.name.startswith("hidden_")] == [
        "hidden_0",
        "hidden_1",
        "hidden_2",
    ]
    assert model.get_layer("hidden_2").units == 2


@pytest.mark.parametrize("builder", BUILTIN_BUILDERS)
def test_unknown_option_is_named(builder: str) -> None:
    shape = [4, 3] if builder == "lstm" else [3]
    with pytest.raises(ValueError, match=r"hiden_units.*allowed: \[.*output_activation"):
        build_model(builder, shape, [1], {"hiden_units": [8]})


def test_lstm_rejects_rank_one_input() -> None:
    with pytest.raises(ValueError, match=r"'lstm'.*\[timesteps, features\].*\[5\]"):
        build_model("lstm", [5], [1])


def test_custom_builder_with_wrong_shapes_is_named() -> None:
    path = "tests.custom_builder:build_wrong_shape"
    with pytest.raises(
        ValueError, match=r"custom_builder:build_wrong_shape.*\[5\].*expected.*\[2\]"
    ):
        build_model(path, [5], [2])


def test_custom_builder_must_return_a_model() -> None:
    with pytest.raises(ValueError, match=r"build_not_a_model.*not a keras.Model"):
        build_model("tests.custom_builder:build_not_a_model", [5], [2])


@pytest.mark.parametrize(
    "path", ["tests.no_such_module:build", "tests.custom_builder:no_such_function"]
)
def test_unimportable_builder_is_named(path: str) -> None:
    with pytest.raises(ValueError, match=f"cannot import builder '{path}'"):
        build_model(path, [5], [2])


@pytest.mark.parametrize("name", ["perceptron", "tests.custom_builder"])
def test_unknown_builder_is_named(name: str) -> None:
    with pytest.raises(ValueError, match=f"unknown builder '{name}'"):
        build_model(name, [5], [2])


@pytest.mark.parametrize("shape", [[], [0], [3, -1]])
def test_bad_shape_is_named(shape: list[int]) -> None:
    with pytest.raises(ValueError, match="input_shape"):
        build_model("linear", shape, [1])
