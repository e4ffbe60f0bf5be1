"""Online target scaling inside the model: the network learns standardized targets, and a last
``target_scaling`` layer maps its output back to the user's units, ``z * std + mean``.

As with input scaling (``livefit.models.standardize``), the statistics are non-trainable
weights of the model, so every snapshot (serving copy, MQTT weights, checkpoint) carries them
and a replica or a ``WeightSubscriber`` predicts in the user's units exactly what the learner
predicts. The trainer keeps the running statistics of the targets (``RunningStandardizer``)
and sets them after each step; the train step fits the layer's input (the standardized
prediction) to the standardized target.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from .standardize import Standardize

TARGET_SCALING_LAYER = "target_scaling"


@keras.saving.register_keras_serializable(package="livefit")
class Unstandardize(Standardize):
    """``z * std + mean`` per output: the inverse of ``Standardize``, with the same statistics
    (``mean`` 0 and ``std`` 1, the identity, until set)."""

    def call(self, inputs):
        return inputs * self.std + self.mean


def with_target_scaling(model: keras.Model, output_shape: Sequence[int]) -> keras.Model:
    """``model`` followed by an ``Unstandardize`` layer named ``target_scaling``.

    The new layer extends ``model``'s own graph, so that the model's top-level layers (an
    input ``standardize`` layer among them, which ``standardize_layer`` looks up by name)
    stay top-level, and the weights keep their order with the target statistics last.
    """
    layer = Unstandardize(tuple(output_shape), name=TARGET_SCALING_LAYER)
    return keras.Model(model.inputs[0], layer(model.outputs[0]), name=f"{model.name}_target_scaled")


def target_scaling_layer(model: keras.Model) -> Unstandardize | None:
    """The model's ``Unstandardize`` layer, if it was built with one."""
    try:
        layer = model.get_layer(TARGET_SCALING_LAYER)
    except ValueError:
        return None
    return layer if isinstance(layer, Unstandardize) else None


def standardized_view(model: keras.Model) -> keras.Model | None:
    """A model sharing ``model``'s layers that returns ``(standardized output, output)``:
    what the train step fits to the standardized target, and the prediction in the user's
    units. None without a ``target_scaling`` layer."""
    layer = target_scaling_layer(model)
    if layer is None:
        return None
    return keras.Model(model.inputs[0], [layer.input, model.outputs[0]], name=f"{model.name}_view")
