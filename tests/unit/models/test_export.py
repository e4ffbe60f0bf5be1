"""ONNX export of a described network (``models/export.py``): onnxruntime, which knows nothing of
Keras, computes what Keras computes with the same weights, at any batch size; without the
converter the error says what to install."""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime
import pytest

from livefit.models.builders import build_model
from livefit.models.description import describe, description_json
from livefit.models.export import ExportUnavailable, export_onnx


@pytest.mark.parametrize(
    ("builder", "ins", "outs", "options", "loss"),
    [("mlp", [8], [1], {"hidden_units": [6, 5]}, "binary_crossentropy"),
     ("lstm", [5, 3], [2], {"units": 4}, "mse")],
)  # fmt: skip
def test_onnxruntime_computes_what_keras_computes(
    builder: str, ins: list[int], outs: list[int], options: dict, loss: str
) -> None:
    model = build_model(builder, ins, outs, options, seed=2, scaling="standardize", loss=loss)
    rng = np.random.default_rng(0)
    weights = [(rng.normal(size=w.shape) * 0.5 + (w.ndim == 1)).astype(np.float32)
               for w in model.get_weights()]  # fmt: skip
    model.set_weights(weights)
    data = export_onnx(description_json(describe(model, loss=loss)), weights)
    session = onnxruntime.InferenceSession(data)
    for rows in (1, 7):
        x = rng.normal(size=(rows, *ins)).astype(np.float32)
        (got,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_without_the_converter_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    model = build_model("linear", [3], [1])
    with pytest.raises(ExportUnavailable, match=r"livefit\[onnx\]"):
        export_onnx(description_json(describe(model)), model.get_weights())
