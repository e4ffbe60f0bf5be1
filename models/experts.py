"""Experts: the configured network and a linear model side by side in one Keras model, their
outputs combined by weights that follow each one's recent prequential error.

No network with one optimizer learns every stream best: a minibatch network trained by Nadam
leads on drifting and nonlinear streams, a linear model trained by plain SGD on noisy linear
ones. Online learning's answer is to learn both on the same samples and weigh them by their
recent losses (exponentially weighted averaging, "Hedge"), which tracks the better one within
a small regret. Here the weights are non-trainable variables of a ``Mixture`` layer, so the
served thing is still one Keras model: snapshots, checkpoints, replicas and subscribers carry
the experts and their weights like any other weights, and ``model(x)`` is the mixture.

The built model, with its layers' names (snapshot keys depend on them)::

    raw_inputs -> standardize -> network (the configured one)  -> experts -> target_scaling
                              -> linear_expert (Flatten, Dense) ->

``experts`` computes ``sum_k share[k] * output_k`` over the experts' outputs (probabilities for
a classifier; standardized values under target scaling). The trainer moves ``recent_error``,
``recent_samples`` and ``share`` after each step (``livefit.server.train.step_graph``); this
module only builds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras

from .standardize import Standardize, stats_shape
from .target_scaling import TARGET_SCALING_LAYER, Unstandardize

EXPERTS_LAYER = "experts"
LINEAR_EXPERT = "linear_expert"
NETWORK_EXPERT = "network"  # the configured network's name among the experts (metric labels)


@keras.saving.register_keras_serializable(package="livefit")
class Mixture(keras.layers.Layer):
    """``sum_k share[k] * inputs[k]``: the experts' outputs weighed by ``share`` (non-trainable,
    summing to 1; equal until the trainer sets them). ``recent_error`` holds each expert's
    discounted sum of prequential errors that ``share`` is computed from."""

    def __init__(self, experts: Sequence[str], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.experts = tuple(experts)
        count = len(self.experts)
        self.share = self.add_weight(
            name="share",
            shape=(count,),
            initializer=keras.initializers.Constant(1.0 / count),
            trainable=False,
        )
        self.recent_error = self.add_weight(
            name="recent_error", shape=(count,), initializer="zeros", trainable=False
        )
        # the same discounted sum of the samples' count: recent_error / recent_samples is each
        # expert's recent error per sample (shape (1,): snapshots store no 0-d arrays)
        self.recent_samples = self.add_weight(
            name="recent_samples", shape=(1,), initializer="zeros", trainable=False
        )

    def call(self, inputs):
        total = inputs[0] * self.share[0]
        for k in range(1, len(self.experts)):
            total = total + inputs[k] * self.share[k]
        return total

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self) -> dict[str, object]:
        return {**super().get_config(), "experts": list(self.experts)}


def linear_expert(
    input_shape: Sequence[int], output_shape: Sequence[int], activation: str | None
) -> keras.Model:
    """A linear model from the (flattened) inputs to the outputs, ending in ``activation`` (per
    row of the last axis for outputs of rank > 1), zero-initialised as River's linear models
    are: it starts predicting the mean (0.5, uniform, or the standardized target's mean)."""
    inputs = keras.Input(shape=tuple(input_shape), dtype="float32", name="linear_inputs")
    x = keras.layers.Flatten(name="linear_flatten")(inputs) if len(input_shape) > 1 else inputs
    rank1 = len(output_shape) == 1
    x = keras.layers.Dense(
        math.prod(output_shape),
        activation=activation if rank1 else None,
        kernel_initializer="zeros",
        dtype="float32",
        name="linear_output",
    )(x)
    if not rank1:
        x = keras.layers.Reshape(tuple(output_shape), name="linear_reshape")(x)
        if activation is not None:
            x = keras.layers.Activation(activation, name="linear_activation")(x)
    return keras.Model(inputs, x, name=LINEAR_EXPERT)


def assemble(
    network: keras.Model,
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    linear_activation: str | None,
    per_last_axis: bool,
    scaling: bool,
    target_scaling: bool,
) -> keras.Model:
    """``network`` and a linear expert behind the input scaling (where ``scaling``), mixed,
    then the target scaling (where ``target_scaling``): one model, named layers."""
    raw = keras.Input(shape=tuple(input_shape), name="raw_inputs")
    x = raw
    if scaling:
        x = Standardize(stats_shape(input_shape, per_last_axis), name="standardize")(x)
    outputs = [network(x), linear_expert(input_shape, output_shape, linear_activation)(x)]
    mixed = Mixture((NETWORK_EXPERT, LINEAR_EXPERT), name=EXPERTS_LAYER)(outputs)
    if target_scaling:
        mixed = Unstandardize(tuple(output_shape), name=TARGET_SCALING_LAYER)(mixed)
    return keras.Model(raw, mixed, name=f"{network.name}_experts")


def mixture_layer(model: keras.Model) -> Mixture | None:
    """The model's ``Mixture`` layer, if it was built with experts."""
    try:
        layer = model.get_layer(EXPERTS_LAYER)
    except ValueError:
        return None
    return layer if isinstance(layer, Mixture) else None


def experts_view(model: keras.Model) -> keras.Model | None:
    """A model sharing ``model``'s layers that returns each expert's output (before the
    mixture: standardized under target scaling) and then the model's output. None without
    experts."""
    layer = mixture_layer(model)
    if layer is None:
        return None
    return keras.Model(
        model.inputs[0], [*layer.input, model.outputs[0]], name=f"{model.name}_experts_view"
    )


def linear_expert_model(model: keras.Model) -> keras.Model | None:
    """The linear expert inside ``model`` (callable on standardized inputs), if any."""
    if mixture_layer(model) is None:
        return None
    return model.get_layer(LINEAR_EXPERT)
