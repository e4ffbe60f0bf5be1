"""How a serving model computes its outputs: the inference runtimes behind ``serve.runtime``.

A runtime is a call on one float32 array of shape (N, *input_shape) that returns the outputs as
a NumPy array, and that reads the weights it was last given. Three exist:

- ``keras``: the Keras model traced once by ``tf.function`` and called through its concrete
  function (TensorFlow's graph executor); every model works.
- ``xla``: the same trace compiled by XLA (``jit_compile=True``), once per padded batch size at
  warm-up; faster calls than the graph's, for seconds of compilation
  (BENCHMARKS.md#serving-runtimes-one-model-call).
- ``numpy``: a plain NumPy forward pass generated from a chain of Dense-type layers (input and
  target scaling, Dense, Dropout, Flatten, Reshape, Activation; the experts' mixture of such
  chains), the same float32 operations in the same order; a 1-row call of the benchmark MLP
  costs microseconds instead of a TensorFlow dispatch. Its weights are the snapshot's own
  arrays (no copy, no Keras variable).

``auto`` takes ``numpy`` where the model is such a chain on a CPU, else ``keras``: XLA's faster
calls did not show as a steady gain end to end (over HTTP, on 2 busy cores, its LSTM answered a
lone client faster in one round and slower in the other) and cost seconds of compilation at
start (docs/benchmarks/runtimes.md). A runtime that cannot take a model (``numpy`` for an LSTM,
``xla`` for an op XLA lacks) falls back to ``keras`` with one log line; outputs agree with
Keras within ``AGREEMENT_TOLERANCE`` (checked on a probe batch before a runtime is used, and by
a unit test per runtime and model).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from livefit.models.experts import mixture_layer
from livefit.models.standardize import Standardize
from livefit.models.target_scaling import Unstandardize

from ..base.flat_call import flat_caller

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "keras", "xla", "numpy")
# |runtime - keras| <= atol + rtol * |keras|, elementwise: float32 sums in another order
AGREEMENT_RTOL, AGREEMENT_ATOL = 1e-4, 1e-5
AGREEMENT_TOLERANCE = {"rtol": AGREEMENT_RTOL, "atol": AGREEMENT_ATOL}


class UnsupportedModel(Exception):
    """The runtime cannot compute this model; the caller falls back to ``keras``."""


class GraphRuntime:
    """The Keras model traced once by ``tf.function`` (``xla``: compiled by XLA), called
    through its flat entry; its weights are the model's variables (``load`` sets them)."""

    pads = True  # calls see only the allowed batch sizes (bounded compiled shapes)

    def __init__(self, model: keras.Model, input_shape: Sequence[int], device: str, xla: bool):
        self.name = "xla" if xla else "keras"
        self.model = model
        self.device = device
        signature = [tf.TensorSpec([None, *input_shape], tf.float32, name="x")]
        # autograph off: nothing to rewrite in one model call (Keras' layers are never converted)
        traced = tf.function(
            lambda x: model(x, training=False),
            input_signature=signature,
            jit_compile=xla,
            autograph=False,
        )
        # The concrete function, called directly: tf.function's own dispatch (argument
        # binding, cache lookup) cost 160 us of a 1-row call of the 64x64 MLP, 85 us directly;
        # weights set later are read through the same variables.
        with tf.device(device):
            self.function = traced.get_concrete_function()  # one trace; it cannot retrace
        self.traced = traced
        self.flat_call = _flat_call(self.function, tuple(input_shape))

    def load(self, weights: Sequence[np.ndarray]) -> None:
        self.model.set_weights(list(weights))

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        with tf.device(self.device):
            return np.asarray(self.flat_call(rows))


def _flat_call(
    function: tf.types.experimental.ConcreteFunction, input_shape: tuple[int, ...]
) -> Callable[[np.ndarray], tf.Tensor]:
    """``function`` as a call on one float32 array of shape (N, *input_shape), through its
    flat entry (``flat_call``: it skips the argument binding, a third of a small model's
    1-row call: docs/benchmarks/defaults.md). Anything else (another dtype or shape, or a
    TensorFlow without that entry) goes through the public call, which checks it."""
    flat = flat_caller(function)
    if flat is None:  # a TensorFlow whose private entry moved: the public call, slower
        return function

    def call(rows: np.ndarray) -> tf.Tensor:
        if rows.dtype != np.float32 or rows.shape[1:] != input_shape:
            return function(rows)
        return flat([rows])  # one output: _call_flat returns it as it is, not in a list

    return call


@dataclass(frozen=True, slots=True)
class _Step:
    """One operation of the NumPy forward pass: ``kind`` and the indices of its weights in
    the model's weight list (``model.get_weights()`` order, the snapshot's order)."""

    kind: str  # "dense", "standardize", "unstandardize", "activation", "reshape", "mixture"
    weights: tuple[int, ...] = ()
    activation: str = "linear"
    shape: tuple[int, ...] = ()
    branches: tuple[tuple[_Step, ...], ...] = ()  # "mixture": each expert's steps


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.float32(0))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "linear": None,
    "relu": _relu,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "softmax": _softmax,
}


class NumpyRuntime:
    """A NumPy forward pass of a chain of Dense-type layers, reading the arrays last loaded
    (a snapshot's own weights: swapping versions replaces one tuple, between calls)."""

    pads = False  # NumPy compiles nothing: any row count costs only its own arithmetic

    def __init__(self, model: keras.Model) -> None:
        self.name = "numpy"
        index = {id(v): i for i, v in enumerate(model.weights)}
        self.steps = tuple(_chain_steps(model, index))
        self.params: tuple[np.ndarray, ...] = tuple(
            np.asarray(w, dtype=np.float32) for w in model.get_weights()
        )
        self.shapes = tuple(p.shape for p in self.params)

    def load(self, weights: Sequence[np.ndarray]) -> None:
        """Compute with ``weights`` (the model's weight list, in order) from the next call on;
        a ValueError, as Keras' ``set_weights`` gives, when their shapes are not the model's."""
        params = tuple(np.asarray(w, dtype=np.float32) for w in weights)
        shapes = tuple(p.shape for p in params)
        if shapes != self.shapes:
            raise ValueError(f"weights of shapes {shapes} for a model of shapes {self.shapes}")
        self.params = params

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self._run(self.steps, rows), dtype=np.float32)

    def _run(self, steps: Sequence[_Step], x: np.ndarray) -> np.ndarray:
        p = self.params
        for step in steps:
            kind = step.kind
            if kind == "dense":
                x = x @ p[step.weights[0]]
                if len(step.weights) > 1:
                    x = x + p[step.weights[1]]
                fn = _ACTIVATIONS[step.activation]
                if fn is not None:
                    x = fn(x)
            elif kind == "standardize":
                x = (x - p[step.weights[0]]) / p[step.weights[1]]
            elif kind == "unstandardize":
                x = x * p[step.weights[1]] + p[step.weights[0]]
            elif kind == "activation":
                fn = _ACTIVATIONS[step.activation]
                if fn is not None:
                    x = fn(x)
            elif kind == "mixture":  # the experts' outputs weighed by their shares
                share = p[step.weights[0]]
                outputs = [self._run(branch, x) for branch in step.branches]
                x = outputs[0] * share[0]
                for k in range(1, len(outputs)):
                    x = x + outputs[k] * share[k]
            else:  # reshape
                x = x.reshape((x.shape[0], *step.shape))
        return x


def _chain_steps(model: keras.Model, index: dict[int, int]) -> list[_Step]:
    """The steps of ``model``'s layers in order, if each is a supported one-input layer; else
    ``UnsupportedModel``. With one input, one output and one-input layers only, the graph is a
    single chain in the layers' (topological) order; a layer called twice would be computed
    once here, which ``check_agreement``'s probe with random weights catches."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedModel(f"{model.name}: more than one input or output")
    mixture = mixture_layer(model)
    # The experts (livefit.models.experts.assemble): the layers feeding the mixture are its
    # branches, each taking what the steps before it computed; the probe checks the shape.
    experts = [] if mixture is None else [t._keras_history.operation for t in mixture.input]
    steps: list[_Step] = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or any(layer is e for e in experts):
            continue
        if getattr(layer, "compute_dtype", "float32") != "float32":
            raise UnsupportedModel(f"layer {layer.name} computes in {layer.compute_dtype}")
        if layer is mixture:
            branches = tuple(tuple(_layer_steps(expert, index)) for expert in experts)
            steps.append(_Step("mixture", (index[id(mixture.share)],), branches=branches))
            continue
        steps.extend(_layer_steps(layer, index))
    return steps


def _layer_steps(layer: keras.layers.Layer, index: dict[int, int]) -> list[_Step]:
    if isinstance(layer, keras.Model):
        return _chain_steps(layer, index)
    if isinstance(layer, Unstandardize):
        return [_Step("unstandardize", (index[id(layer.mean)], index[id(layer.std)]))]
    if isinstance(layer, Standardize):
        return [_Step("standardize", (index[id(layer.mean)], index[id(layer.std)]))]
    if type(layer) is keras.layers.Dense:
        if getattr(layer, "lora_enabled", False) or layer.quantization_mode is not None:
            raise UnsupportedModel(f"layer {layer.name}: LoRA or quantized Dense")
        weights: tuple[int, ...] = (index[id(layer.kernel)],)
        if layer.use_bias:
            weights += (index[id(layer.bias)],)
        return [_Step("dense", weights, activation=_activation_name(layer))]
    if type(layer) is keras.layers.Activation:
        return [_Step("activation", activation=_activation_name(layer))]
    if type(layer) is keras.layers.Dropout:
        return []  # the identity at inference
    if type(layer) in (keras.layers.Flatten, keras.layers.Reshape):
        return [_Step("reshape", shape=tuple(layer.output.shape[1:]))]
    raise UnsupportedModel(f"layer {layer.name} ({type(layer).__name__}) has no NumPy form")


def _activation_name(layer: keras.layers.Layer) -> str:
    name = keras.activations.serialize(layer.activation)
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise UnsupportedModel(f"layer {layer.name}: activation {name!r} has no NumPy form")
    return name


Runtime = GraphRuntime | NumpyRuntime


def build_runtime(
    choice: str, model: keras.Model, input_shape: Sequence[int], device: str, name: str = ""
) -> Runtime:
    """The runtime ``choice`` names (``auto``: ``numpy`` for a Dense chain, else ``keras``) for
    ``model``, checked against Keras on a probe batch; ``keras`` where it cannot be used (one
    log line says why, naming the model ``name``)."""
    if choice not in RUNTIMES:
        raise ValueError(f"serve.runtime must be one of {', '.join(RUNTIMES)}, got {choice!r}")
    on_gpu = "GPU" in device.upper()
    if choice == "keras" or (choice == "auto" and on_gpu):  # NumPy would take it off the GPU
        return GraphRuntime(model, input_shape, device, xla=False)
    candidates = ["numpy"] if choice == "auto" else [choice]
    reasons = []
    for candidate in candidates:
        try:
            runtime = _candidate(candidate, model, input_shape, device)
            check_agreement(runtime, model, input_shape)
            return runtime
        except Exception as exc:  # any failure: the graph runtime serves every model
            reasons.append(f"{candidate}: {exc}")
    # a warning when the setting named the runtime; under "auto" the fallback is by design
    log.log(
        logging.INFO if choice == "auto" else logging.WARNING,
        "model %s: serve.runtime %r not usable (%s); serving with keras",
        name or model.name, choice, "; ".join(reasons),
    )  # fmt: skip
    return GraphRuntime(model, input_shape, device, xla=False)


def second_runtime(
    runtime: Runtime, model: keras.Model, input_shape: Sequence[int], device: str
) -> Runtime:
    """Another runtime of ``runtime``'s kind that computes ``model`` with weights of its own
    (past versions beside the newest): a NumPy pass over the same layers, or the graph of a
    clone of the network (an exception where Keras cannot clone it)."""
    if isinstance(runtime, NumpyRuntime):
        return NumpyRuntime(model)
    with tf.device(device):
        clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())  # the same layout; a shape mismatch raises here
    return GraphRuntime(clone, input_shape, device, xla=runtime.name == "xla")


def _candidate(name: str, model: keras.Model, input_shape: Sequence[int], device: str) -> Runtime:
    if name == "numpy":
        return NumpyRuntime(model)
    return GraphRuntime(model, input_shape, device, xla=True)


def _nonzero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random values of either sign, at least 0.5 from zero (a ``std`` to divide by too)."""
    return rng.choice([-1.0, 1.0], size=shape) * (np.abs(rng.normal(size=shape)) + 0.5)


def check_agreement(runtime: Runtime, model: keras.Model, input_shape: Sequence[int]) -> None:
    """Raise ``UnsupportedModel`` unless ``runtime`` computes what Keras computes for a probe
    batch of 3 rows, with random weights (scaling statistics away from the identity, so that a
    layer skipped or applied twice shows); the model's own weights are restored after."""
    own = model.get_weights()
    rng = np.random.default_rng(0)
    probe_weights = [_nonzero(rng, w.shape).astype(w.dtype) for w in own]
    probe = rng.standard_normal((3, *input_shape)).astype(np.float32)
    try:
        model.set_weights(probe_weights)
        runtime.load(probe_weights)
        expected = np.asarray(model(probe, training=False))
        got = runtime(probe)
    finally:
        model.set_weights(own)
        runtime.load(own)
    if got.shape != expected.shape or not np.allclose(
        got, expected, rtol=AGREEMENT_RTOL, atol=AGREEMENT_ATOL
    ):
        raise UnsupportedModel("its outputs differ from Keras on a probe batch")
