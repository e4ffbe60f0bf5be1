"""A described network with given weights as an ONNX file, for runtimes without TensorFlow.

Keras' own ONNX export (``model.export(..., format="onnx")``, which converts with ``tf2onnx``
and ``onnx``: ``pip install "livefit[onnx]"``). The batch axis stays free. A conversion
takes a second or so of CPU (docs/http.md, "Outside Python"): make them on request, not per
snapshot.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .description import model_from_description

ONNX_CONTENT_TYPE = "application/onnx"


class ExportUnavailable(RuntimeError):
    """The converter is not installed in this process."""


def export_onnx(description: str, arrays: Sequence[np.ndarray]) -> bytes:
    """The ONNX file of the network ``description`` names, with ``arrays`` as its weights;
    ``ExportUnavailable`` without ``tf2onnx`` and ``onnx``, ``DescriptionError`` for a
    description that does not build."""
    try:
        import onnx  # noqa: F401  (Keras imports it lazily: fail before building anything)
        import tf2onnx  # noqa: F401
    except ImportError as exc:
        raise ExportUnavailable(
            f"ONNX export needs tf2onnx and onnx ({exc.name} is missing): "
            'pip install "livefit[onnx]"'
        ) from None
    model = model_from_description(description)
    model.set_weights(list(arrays))
    model(np.zeros((1, *model.inputs[0].shape[1:]), np.float32))  # Keras exports called models
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.onnx"
        model.export(str(path), format="onnx", verbose=False)
        return path.read_bytes()
