"""Online feature scaling inside the model: ``(x - mean) / std`` with non-trainable statistics.

The statistics live in the model as weights, so every snapshot (serving copy, MQTT weights,
checkpoint) carries them, and a replica or a ``WeightSubscriber`` predicts exactly what the
learner predicts. The trainer updates them from its running standardizer after each step.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

STANDARDIZE_LAYER = "standardize"


@keras.saving.register_keras_serializable(package="livefit")
class Standardize(keras.layers.Layer):
    """``(x - mean) / std`` per feature; ``mean`` 0 and ``std`` 1 (the identity) until set."""

    def __init__(self, stats_shape: Sequence[int], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.stats_shape = tuple(stats_shape)
        self.mean = self.add_weight(
            name="mean", shape=self.stats_shape, initializer="zeros", trainable=False
        )
        self.std = self.add_weight(
            name="std", shape=self.stats_shape, initializer="ones", trainable=False
        )

    def call(self, inputs):
        return (inputs - self.mean) / self.std

    def set_statistics(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Set the statistics (broadcast to the layer's shape)."""
        self.mean.assign(broadcast_statistic(mean, self.stats_shape))
        self.std.assign(broadcast_statistic(std, self.stats_shape))

    def get_config(self) -> dict[str, object]:
        return {**super().get_config(), "stats_shape": list(self.stats_shape)}


def broadcast_statistic(value: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """A mean or std as a float32 array of the layer's statistics shape."""
    shape = tuple(shape)
    if value.shape == shape and value.dtype == np.float32 and value.flags.c_contiguous:
        return value  # the common case, once per training step: no copy
    return np.ascontiguousarray(np.broadcast_to(value, shape), dtype=np.float32)


def stats_shape(input_shape: Sequence[int], per_last_axis: bool) -> tuple[int, ...]:
    """Per feature: the whole input shape, or for sequences [T, F] one statistic per F."""
    return (input_shape[-1],) if per_last_axis else tuple(input_shape)


def with_standardization(
    model: keras.Model, input_shape: Sequence[int], per_last_axis: bool
) -> keras.Model:
    """``model`` behind a ``Standardize`` layer named ``standardize``."""
    inputs = keras.Input(shape=tuple(input_shape), name="raw_inputs")
    scaled = Standardize(stats_shape(input_shape, per_last_axis), name=STANDARDIZE_LAYER)(inputs)
    return keras.Model(inputs, model(scaled), name=f"{model.name}_standardized")


def standardize_layer(model: keras.Model) -> Standardize | None:
    """The model's ``Standardize`` layer, if it was built with one."""
    try:
        layer = model.get_layer(STANDARDIZE_LAYER)
    except ValueError:
        return None
    return layer if isinstance(layer, Standardize) else None
