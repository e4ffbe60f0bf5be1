"""Keras model builders: networks only, nothing of MQTT or HTTP.

``build_model`` and ``weight_names`` import Keras on first use, so that ``livefit.models.names``
(what ``livefit.server.config`` checks names against) loads without TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

BUILTIN_BUILDERS = ("linear", "mlp", "lstm")

if TYPE_CHECKING:
    from livefit.models.builders import build_model, weight_names

__all__ = ["BUILTIN_BUILDERS", "build_model", "weight_names"]


def __getattr__(name: str) -> Any:
    if name in ("build_model", "weight_names"):
        from livefit.models import builders

        return getattr(builders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
