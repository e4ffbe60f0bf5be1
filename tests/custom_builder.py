"""User-style builders for the contract tests, referenced as ``tests.custom_builder:NAME``."""

from __future__ import annotations

import math

import keras


def build(
    input_shape: tuple[int, ...], output_shape: tuple[int, ...], units: int = 16
) -> keras.Model:
    """A well-behaved custom builder: a small tanh MLP with explicitly named layers."""
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Flatten(name="flatten")(inputs)
    x = keras.layers.Dense(units, activation="tanh", name="custom_hidden")(x)
    x = keras.layers.Dense(math.prod(output_shape), name="custom_output")(x)
    x = keras.layers.Reshape(output_shape, name="custom_reshape")(x)
    return keras.Model(inputs, x, name="custom")


def build_wrong_shape(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> keras.Model:
    """Ignores ``output_shape`` and always returns one output too many."""
    return build(input_shape, (math.prod(output_shape) + 1,))


def build_not_a_model(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> object:
    """Returns something that is not a Keras model."""
    return object()


def build_batch_norm(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> keras.Model:
    """A tanh layer followed by batch normalisation: moving statistics that the training
    forward pass itself moves (what a rolled-back or rewound step must put back)."""
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Dense(16, activation="tanh", name="bn_hidden")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="bn")(x)
    return keras.Model(inputs, keras.layers.Dense(math.prod(output_shape), name="bn_out")(x))
