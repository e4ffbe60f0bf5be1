"""Keras model builders: networks only, nothing of MQTT or HTTP."""

from livefit.models.builders import BUILTIN_BUILDERS, build_model, weight_names

__all__ = ["BUILTIN_BUILDERS", "build_model", "weight_names"]
