"""The experts model (``livefit.models.experts``): built, mixed, one model to serve."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from livefit.models.builders import build_model, output_activation_name, weight_names
from livefit.models.experts import (
    LINEAR_EXPERT,
    Mixture,
    experts_view,
    linear_expert_model,
    mixture_layer,
)


@pytest.mark.parametrize(
    ("builder", "input_shape", "output_shape", "loss"),
    [
        ("mlp", [4], [1], "mse"),
        ("mlp", [4], [3], "sparse_categorical_crossentropy"),
        ("linear", [4], [2, 3], "categorical_crossentropy"),
        ("lstm", [5, 3], [1], "binary_crossentropy"),
    ],
)
def test_the_served_output_is_the_experts_outputs_weighed_by_their_shares(
    builder: str, input_shape: list[int], output_shape: list[int], loss: str
) -> None:
    model = build_model(builder, input_shape, output_shape, seed=1, scaling="standardize",
                        loss=loss, experts=True)  # fmt: skip
    mixture = mixture_layer(model)
    view = experts_view(model)
    assert mixture is not None and view is not None
    assert mixture.experts == ("network", LINEAR_EXPERT)
    rng = np.random.default_rng(0)
    linear = linear_expert_model(model)
    assert linear is not None
    for layer in linear.layers:  # a linear expert of random weights, not zeros
        for w in layer.weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
    mixture.share.assign(np.array([0.3, 0.7], np.float32))
    x = rng.normal(size=(6, *input_shape)).astype(np.float32)
    network_out, linear_out, served = (np.asarray(t) for t in view(x))
    np.testing.assert_allclose(np.asarray(model(x)), served, rtol=1e-6)
    expected = 0.3 * network_out + 0.7 * linear_out
    if loss == "mse":  # the target scaling follows the mixture (identity statistics here)
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    else:  # probabilities: a mixture of distributions is one
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
        if output_shape[-1] > 1:
            np.testing.assert_allclose(served.sum(axis=-1), 1.0, rtol=1e-5)


def test_names_and_activation_follow_the_network() -> None:
    model = build_model("mlp", [4], [1], seed=1, scaling="standardize",
                        loss="binary_crossentropy", experts=True)  # fmt: skip
    names = weight_names(model)
    assert names[:2] == ["standardize/mean", "standardize/std"]
    assert {"linear_output/kernel", "linear_output/bias", "experts/share",
            "experts/recent_error", "experts/recent_samples"} <= set(names)  # fmt: skip
    assert output_activation_name(model) == "sigmoid"  # the network's, through the mixture
    linear = linear_expert_model(model)
    assert linear is not None and not np.any(linear.get_weights()[0])  # zero-initialised
    # the same seed, the same weights: a replica builds what the learner built
    twin = build_model("mlp", [4], [1], seed=1, scaling="standardize",
                       loss="binary_crossentropy", experts=True)  # fmt: skip
    for a, b in zip(model.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_model_without_experts_has_none() -> None:
    model = build_model("mlp", [4], [1], seed=1, loss="mse")
    assert mixture_layer(model) is None and experts_view(model) is None
    assert linear_expert_model(model) is None


def test_the_mixture_layer_serializes() -> None:
    layer = Mixture(("network", LINEAR_EXPERT), name="experts")
    again = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(again, Mixture) and again.experts == layer.experts
    np.testing.assert_allclose(np.asarray(layer.share), [0.5, 0.5])
