"""A network's description (``models/description.py``): the same text in every process that
describes the same network, a network rebuilt from it that computes what the original does,
a forward pass another runtime can follow from ``layers``, and refusals of what must not be
built from a message."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from livefit.models.builders import build_model
from livefit.models.description import (
    MAX_DESCRIPTION_BYTES,
    DescriptionError,
    describe,
    description_json,
    model_from_description,
)

READER = Path(__file__).resolve().parents[3] / "examples" / "numpy_reader.py"


def _reader() -> Any:
    """``examples/numpy_reader.py``, the NumPy-only reader another runtime would port."""
    spec = importlib.util.spec_from_file_location("numpy_reader", READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NETWORKS = [
    ("mlp", [8], [1], {"hidden_units": [6, 5], "activation": "relu"}, "mse"),
    ("mlp", [8], [1], {"hidden_units": [4], "dropout": 0.2}, "binary_crossentropy"),
    ("linear", [3, 4], [2, 3], {}, "categorical_crossentropy"),
    ("lstm", [5, 3], [2], {"units": 4}, "mse"),
]


def _random_weights(model: keras.Model, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=w.shape) * 0.5 + (w.ndim == 1) * 1.0).astype(np.float32)
            for w in model.get_weights()]  # fmt: skip


@pytest.mark.parametrize(("builder", "ins", "outs", "options", "loss"), NETWORKS)
def test_a_network_rebuilt_from_its_description_computes_the_same(
    builder: str, ins: list[int], outs: list[int], options: dict, loss: str
) -> None:
    model = build_model(builder, ins, outs, options, seed=3, scaling="standardize", loss=loss)
    text = description_json(describe(model, loss=loss, builder={"name": builder}))
    rebuilt = model_from_description(text)
    assert description_json(describe(rebuilt, loss=loss, builder={"name": builder})) == text
    weights = _random_weights(model)
    model.set_weights(weights)
    rebuilt.set_weights(weights)
    x = np.random.default_rng(1).normal(size=(4, *ins)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(rebuilt(x)), np.asarray(model(x)))
    doc = json.loads(text)
    assert doc["input"]["shape"] == ins and doc["output"]["shape"] == outs
    assert [t["key"] for t in doc["tensors"]][:1] == ["0000:standardize/mean"]


@pytest.mark.parametrize(("builder", "ins", "outs", "options", "loss"), NETWORKS)
def test_layers_are_a_forward_pass_numpy_alone_can_follow(
    builder: str, ins: list[int], outs: list[int], options: dict, loss: str
) -> None:
    model = build_model(builder, ins, outs, options, seed=3, scaling="standardize", loss=loss)
    doc = describe(model, loss=loss)
    weights = _random_weights(model, seed=2)
    model.set_weights(weights)
    tensors = {t["key"]: w for t, w in zip(doc["tensors"], weights, strict=True)}
    x = np.random.default_rng(4).normal(size=(6, *ins)).astype(np.float32)
    got = _reader().forward(json.loads(description_json(doc)), tensors, x)
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_lstm_layers_name_their_gates_and_tensors() -> None:
    model = build_model("lstm", [5, 3], [2], {"units": 4}, seed=3)
    steps = describe(model)["layers"]
    lstm = next(s for s in steps if s["kind"] == "lstm")
    assert (lstm["units"], lstm["gates"], lstm["return_sequences"]) == (4, "ifco", False)
    assert lstm["kernel"].endswith("kernel") and lstm["recurrent_kernel"]


def _described(change: Any = None) -> dict:
    model = build_model("mlp", [8], [1], {"hidden_units": [4]}, seed=1, scaling="standardize")
    doc = json.loads(description_json(describe(model)))
    if change is not None:
        change(doc["keras"]["config"]["layers"])
    return doc


def _hidden(layers: list[dict]) -> dict:
    inner = next(layer for layer in layers if layer["class_name"] == "Functional")
    return next(layer for layer in inner["config"]["layers"] if layer["name"] == "hidden_0")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda layers: _hidden(layers).update(class_name="Lambda"), "runs code"),
        (lambda layers: _hidden(layers).update(class_name="TFSMLayer"), "runs code"),
        (lambda layers: _hidden(layers).update(module="os", class_name="system"), "not allowed"),
        (lambda layers: _hidden(layers).update(module="evil.layers", registered_name="evil>X"),
         "not registered"),
        (None, "takes and gives"),
    ],
)  # fmt: skip
def test_what_must_not_be_built_is_refused(change: Any, says: str) -> None:
    """Code-carrying classes, modules outside Keras, unregistered custom classes, a network
    that is not what it declares: refused before (or instead of) Keras builds them."""
    doc = _described(change)
    if change is None:  # builds, but not into the shapes it declares
        doc["output"]["shape"] = [2]
    with pytest.raises(DescriptionError, match=says):
        model_from_description(json.dumps(doc))


def test_an_unbounded_or_malformed_description_is_refused() -> None:
    with pytest.raises(DescriptionError, match="over"):
        model_from_description(" " * (MAX_DESCRIPTION_BYTES + 1))
    with pytest.raises(DescriptionError, match="not JSON"):
        model_from_description("{" * 100_000)
    with pytest.raises(DescriptionError, match="format"):
        model_from_description('{"format": 2, "keras": {}}')
    with pytest.raises(DescriptionError, match="deeper"):
        model_from_description(json.dumps({"format": 1, "keras": {"a": [[[[[[{}]]]]]] * 1}})
                               .replace("{}", json.dumps(_deep(80))))  # fmt: skip


def _deep(levels: int) -> Any:
    doc: Any = {}
    for _ in range(levels):
        doc = {"x": [doc]}
    return doc
