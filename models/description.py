"""A network's *description*: what a process needs to run it without the learner's config.

The learner puts it in every snapshot (the safetensors metadata key ``description``, bound by
the signed envelope's ``description_sha256``), and ``GET /v1/models/{name}/description``
serves it, so a process that knows only a broker (or URL), a model name and a key can build the
network (``model_from_description``) or, without TensorFlow, run it from ``layers``.

A description is one JSON object, written canonically (``description_json``: keys sorted, no
spaces), so that its sha256 is the same in every process that describes the same network:

- ``format``: 1.
- ``keras``: Keras' own serialization of the whole model (``serialize_keras_object``, without
  compile state): the architecture, livefit's scaling layers (``livefit>Standardize``,
  ``livefit>Unstandardize``) and whatever else the served function computes; ``keras_version``.
- ``input`` and ``output``: ``{"shape": [...], "dtype": "float32"}`` per sample (no batch
  axis); ``output.activation``: the activation that produces the output (``sigmoid``, ...).
- ``loss`` and ``builder`` (``name``, ``options``, ``scaling``, ``target_scaling``): the
  learner's settings, for people; nothing is built from them.
- ``tensors``: the safetensors keys in model order, each with its variable name, shape and dtype.
- ``layers``: for a chain of Dense-type layers (the built-in ``linear`` and ``mlp``, the
  ``lstm``) the forward pass as a list another runtime can follow, each entry with ``kind``
  (``standardize`` ``(x - mean) / std``, ``dense`` ``act(x @ kernel + bias)``, ``activation``,
  ``dropout`` (the identity when predicting), ``reshape``, ``lstm``, ``unstandardize``
  ``x * std + mean``, and ``mixture``: ``experts``, one such list per expert, each run on what
  came before, their outputs summed weighed by ``share``, a tensor), ``name``,
  ``output_shape`` and its tensors by safetensors key; ``null`` for other networks
  (``layers_note`` says which layer has no such form).

Building a network from a description is code-adjacent, so ``model_from_description`` takes
one only after its snapshot's signature verified (the caller's part), at most
``MAX_DESCRIPTION_BYTES``, with every serialized class either Keras' own (less the ones that
run code or load files: ``DENIED_CLASSES``) or registered with
``keras.saving.register_keras_serializable`` in this process, and Keras' ``safe_mode``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from .builders import output_activation_name, weight_names
from .experts import mixture_layer
from .standardize import Standardize
from .target_scaling import Unstandardize

FORMAT = 1
MAX_DESCRIPTION_BYTES = 1024 * 1024
# Keras classes that carry code or load files: never built from a message.
DENIED_CLASSES = frozenset(
    {"Lambda", "__lambda__", "TFSMLayer", "TorchModuleWrapper", "JaxLayer", "FlaxLayer"}
)


class DescriptionError(ValueError):
    """A description this process cannot (or must not) build a network from."""


def describe(
    model: keras.Model,
    *,
    loss: str | None = None,
    builder: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The description of ``model`` (module docstring); ``loss`` and ``builder`` are the
    learner's settings, recorded for people."""
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)
    keys = tensor_keys(model)
    layers, note = _layers(model, {id(v): k for v, k in zip(model.weights, keys, strict=True)})
    doc: dict[str, Any] = {
        "format": FORMAT,
        "keras": config,
        "keras_version": keras.__version__,
        "input": {"shape": list(model.inputs[0].shape[1:]), "dtype": "float32"},
        "output": {
            "shape": list(model.outputs[0].shape[1:]),
            "dtype": "float32",
            "activation": output_activation_name(model),
        },
        "loss": loss,
        "builder": dict(builder) if builder is not None else None,
        "tensors": [_tensor(key, v) for key, v in zip(keys, model.weights, strict=True)],
        "layers": layers,
    }
    if note:
        doc["layers_note"] = note
    return doc


def _tensor(key: str, variable: Any) -> dict[str, Any]:
    return {"key": key, "name": key.split(":", 1)[1], "shape": list(variable.shape),
            "dtype": str(np.dtype(variable.dtype))}  # fmt: skip


def description_json(doc: Mapping[str, Any]) -> str:
    """``doc`` as canonical JSON text (what snapshots carry and ``description_sha256`` hashes)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def tensor_keys(model: keras.Model) -> list[str]:
    """The safetensors keys of ``model``'s weights, in order (``weights.format``'s keys)."""
    return [f"{i:04d}:{name}" for i, name in enumerate(weight_names(model))]


def parse_description(text: str | bytes) -> dict[str, Any]:
    """A description's JSON object; DescriptionError when too large, not JSON or of another
    format."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_DESCRIPTION_BYTES:
        raise DescriptionError(f"description of {size} bytes, over {MAX_DESCRIPTION_BYTES}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DescriptionError(f"description is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DescriptionError(f"not a livefit description of format {FORMAT}")
    if not isinstance(doc.get("keras"), dict):
        raise DescriptionError("description has no Keras model config")
    return doc


def model_from_description(text: str | bytes) -> keras.Model:
    """Build the network a description names (uncompiled, fresh weights); DescriptionError
    when it is too large, names a class not allowed (module docstring) or does not build into
    a one-input, one-output model of its declared shapes."""
    doc = parse_description(text)
    check_allowed(doc["keras"])
    try:
        model = keras.saving.deserialize_keras_object(doc["keras"], safe_mode=True)
    except Exception as exc:  # Keras raises TypeError, ValueError, KeyError ... on bad configs
        raise DescriptionError(f"the description does not build: {exc!r}"[:2000]) from None
    if not isinstance(model, keras.Model) or len(model.inputs) != 1 or len(model.outputs) != 1:
        raise DescriptionError("the description is not a one-input, one-output Keras model")
    shapes = ([*model.inputs[0].shape[1:]], [*model.outputs[0].shape[1:]])
    declared = (doc.get("input", {}).get("shape"), doc.get("output", {}).get("shape"))
    if list(shapes) != list(declared):
        raise DescriptionError(f"the model built takes and gives {shapes}, described {declared}")
    return model


def check_allowed(config: Any, depth: int = 0) -> None:
    """DescriptionError unless every serialized object in ``config`` is a Keras class (not one
    of ``DENIED_CLASSES``) or registered as serializable in this process."""
    if depth > 64:
        raise DescriptionError("description nested deeper than 64 levels")
    if isinstance(config, list):
        for item in config:
            check_allowed(item, depth + 1)
        return
    if not isinstance(config, dict):
        return
    name = config.get("class_name")
    if isinstance(name, str) and "module" in config:
        _check_class(name, config.get("module"), config.get("registered_name"))
    for value in config.values():
        check_allowed(value, depth + 1)


def _check_class(name: str, module: Any, registered: Any) -> None:
    if name in DENIED_CLASSES:
        raise DescriptionError(f"class {name} runs code or loads files: not built from a message")
    if registered and registered in keras.saving.get_custom_objects():
        return
    if registered and not str(module).startswith("keras"):
        raise DescriptionError(
            f"class {registered} is not registered in this process: import the module that "
            "registers it (keras.saving.register_keras_serializable) before building"
        )
    if not isinstance(module, str) or not (module == "keras" or module.startswith("keras.")):
        if module is None and name == "function":
            return
        raise DescriptionError(f"class {name} of module {module!r} is not allowed")


def _layers(model: keras.Model, keys: dict[int, str]) -> tuple[list[dict] | None, str]:
    """The forward pass as a list of steps, or None and why not."""
    try:
        return _chain(model, keys), ""
    except _NoForm as exc:
        return None, str(exc)


class _NoForm(Exception):
    """The network is not a chain of layers with a runtime-neutral form."""


def _chain(model: keras.Model, keys: dict[int, str]) -> list[dict]:
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise _NoForm(f"{model.name}: more than one input or output")
    mixture = mixture_layer(model)
    # The experts (experts.assemble): each a chain of its own from what came before them
    experts = [] if mixture is None else [t._keras_history.operation for t in mixture.input]
    steps: list[dict] = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or any(layer is e for e in experts):
            continue
        if mixture is not None and layer is mixture:
            branches = [_chain(e, keys) if isinstance(e, keras.Model) else [_step(e, keys)]
                        for e in experts]  # fmt: skip
            steps.append({"name": layer.name, "output_shape": list(layer.output.shape[1:]),
                          "kind": "mixture", "share": keys[id(mixture.share)],
                          "experts": branches})  # fmt: skip
            continue
        if isinstance(layer, keras.Model):
            steps.extend(_chain(layer, keys))
            continue
        if len(layer._inbound_nodes) != 1:  # a shared layer: the graph is no chain
            raise _NoForm(f"layer {layer.name} is called more than once")
        steps.append(_step(layer, keys))
    return steps


def _step(layer: keras.layers.Layer, keys: dict[int, str]) -> dict[str, Any]:
    step: dict[str, Any] = {"name": layer.name, "output_shape": list(layer.output.shape[1:])}
    if isinstance(layer, Unstandardize):
        return {**step, "kind": "unstandardize", "mean": keys[id(layer.mean)],
                "std": keys[id(layer.std)]}  # fmt: skip
    if isinstance(layer, Standardize):
        return {**step, "kind": "standardize", "mean": keys[id(layer.mean)],
                "std": keys[id(layer.std)]}  # fmt: skip
    kind = type(layer)
    if kind is keras.layers.Dense:
        return {**step, "kind": "dense", "units": layer.units,
                "activation": _activation(layer.activation), "kernel": keys[id(layer.kernel)],
                "bias": keys[id(layer.bias)] if layer.use_bias else None}  # fmt: skip
    if kind is keras.layers.Activation:
        return {**step, "kind": "activation", "activation": _activation(layer.activation)}
    if kind is keras.layers.Dropout:
        return {**step, "kind": "dropout"}
    if kind in (keras.layers.Flatten, keras.layers.Reshape):
        return {**step, "kind": "reshape"}
    if kind is keras.layers.LSTM:
        cell = layer.cell
        return {**step, "kind": "lstm", "units": cell.units, "gates": "ifco",
                "activation": _activation(cell.activation),
                "recurrent_activation": _activation(cell.recurrent_activation),
                "return_sequences": layer.return_sequences, "kernel": keys[id(cell.kernel)],
                "recurrent_kernel": keys[id(cell.recurrent_kernel)],
                "bias": keys[id(cell.bias)] if cell.use_bias else None}  # fmt: skip
    raise _NoForm(f"layer {layer.name} ({type(layer).__name__}) has no runtime-neutral form")


def _activation(function: Any) -> str:
    name = keras.activations.serialize(function)
    if not isinstance(name, str):
        raise _NoForm(f"activation {name!r} has no name")
    return name
