"""Build uncompiled Keras networks by name: the built-ins or a user's ``package.module:function``.

Every network takes ``(None, *input_shape)`` and returns ``(None, *output_shape)`` in float32.
Built-in layers carry fixed names ("hidden_0", "output", ...) because weight names key the
safetensors files that learner and replicas exchange, so they must match across processes.
Every problem with a builder name, its options or what it returns raises ``ValueError``.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras

from .experts import EXPERTS_LAYER, assemble
from .names import BUILDER_OPTIONS, BUILTIN_BUILDERS
from .outputs import (
    default_output_activation,
    default_target_scaling,
    output_problem,
    target_scaling_problem,
)
from .standardize import with_standardization
from .target_scaling import TARGET_SCALING_LAYER, with_target_scaling

_DEFAULT_OPTIONS = BUILDER_OPTIONS


def build_model(
    builder: str,
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    scaling: str = "none",
    loss: str = "mse",
    target_scaling: str | None = None,
    experts: bool = False,
) -> keras.Model:
    """Build the network ``builder`` names; the same ``seed`` gives the same initial weights.

    ``scaling="standardize"`` puts a ``Standardize`` layer in front (per feature; for ``[T, F]``
    sequence inputs, per F pooled over time). ``loss`` (the learner's ``loss``, default
    ``mse`` as there) picks a built-in builder's output activation when the options leave it
    out: sigmoid for binary cross-entropy, softmax for (sparse) categorical cross-entropy,
    linear otherwise; an activation that cannot train under the loss is a ValueError.
    ``target_scaling`` (default: ``standardize`` for regression losses such as ``mse``, else
    ``none``) ends the network in a ``target_scaling`` layer that maps standardized outputs
    back to the targets' units. Build with the learner's builder, options, shapes, seed,
    scaling, loss and target scaling to use its weights. ``experts`` puts a linear model beside
    the network, both behind the input scaling, their outputs mixed before the target scaling
    (``livefit.models.experts``; a learner's ``experts.enabled``).
    """
    in_shape = _check_shape("input_shape", input_shape)
    out_shape = _check_shape("output_shape", output_shape)
    if scaling not in ("none", "standardize"):
        raise ValueError(f'scaling must be "none" or "standardize", got {scaling!r}')
    if target_scaling is None:
        target_scaling = default_target_scaling(loss)
    problem = target_scaling_problem(loss, target_scaling)
    if problem is not None:
        raise ValueError(problem)
    opts = dict(options or {})
    if builder in BUILTIN_BUILDERS:
        opts = _resolve_options(builder, opts)
        if opts.get("output_activation") is None:
            opts["output_activation"] = default_output_activation(loss)
        problem = output_problem(loss, opts["output_activation"], out_shape)
        if problem is not None:
            raise ValueError(f"builder {builder!r}: {problem}")
        _seed(seed)
        model = _BUILTINS[builder](in_shape, out_shape, **opts)
    else:
        function = _load_builder(builder)
        _seed(seed)
        model = function(input_shape=in_shape, output_shape=out_shape, **opts)
        _check_custom_model(builder, model, in_shape, out_shape)
    if experts:
        return assemble(
            model,
            in_shape,
            out_shape,
            default_output_activation(loss),  # the linear model River's learners are
            per_last_axis=builder == "lstm",
            scaling=scaling == "standardize",
            target_scaling=target_scaling == "standardize",
        )
    if scaling == "standardize":
        model = with_standardization(model, in_shape, per_last_axis=builder == "lstm")
    if target_scaling == "standardize":
        model = with_target_scaling(model, out_shape)
    return model


def output_activation_name(model: keras.Model) -> str | None:
    """The name of the activation that produces ``model``'s output (``"sigmoid"``,
    ``"linear"``, ...), looking through reshapes, nested models, livefit's scaling layers and
    the experts' mixture (to the configured network, its first expert); None when the last
    layer that computes something has no ``activation``."""
    layer: Any = model
    while True:
        if isinstance(layer, keras.Model):
            outputs = getattr(layer, "outputs", None)
            history = getattr(outputs[0], "_keras_history", None) if outputs else None
            if history is None:
                return None
            layer = history.operation
            continue
        if isinstance(layer, _PASS_THROUGH) or layer.name in (TARGET_SCALING_LAYER, EXPERTS_LAYER):
            inbound = getattr(layer, "_inbound_nodes", None)
            if not inbound or not inbound[0].input_tensors:
                return None
            layer = inbound[0].input_tensors[0]._keras_history.operation
            continue
        activation = getattr(layer, "activation", None)
        if activation is None:
            return None
        return str(getattr(activation, "__name__", activation))


def weight_names(model: keras.Model) -> list[str]:
    """Unique names for ``model.weights``, in order; deterministic for explicitly named layers.

    Each name is the variable's Keras path ("hidden_0/kernel"); a path seen again (possible in
    nested custom models) gets ":1", ":2", ... appended, a character Keras paths never hold.
    """
    seen: Counter[str] = Counter()
    names = []
    for variable in model.weights:
        path = variable.path
        names.append(path if seen[path] == 0 else f"{path}:{seen[path]}")
        seen[path] += 1
    return names


def _check_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape as a tuple of positive ints, or a ValueError naming ``name``."""
    dims = tuple(shape)
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise ValueError(f"{name} must be a non-empty list of positive ints, got {list(shape)}")
    return dims


def _resolve_options(builder: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The builder's defaults overlaid with ``options``; an unknown key is a user's typo."""
    allowed = _DEFAULT_OPTIONS[builder]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for builder {builder!r}; allowed: {sorted(allowed)}"
        )
    return {**allowed, **options}


def _seed(seed: int | None) -> None:
    """Seed Python, NumPy and the backend so initial weights are reproducible."""
    if seed is not None:
        keras.utils.set_random_seed(seed)


def _positive_int(builder: str, option: str, value: Any) -> int:
    """``value`` if it is an int >= 1, else a ValueError naming the option."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"builder {builder!r}: option {option!r} must be an int >= 1, got {value!r}"
        )
    return value


def _inputs(in_shape: tuple[int, ...]) -> keras.KerasTensor:
    return keras.Input(shape=in_shape, dtype="float32", name="inputs")


def _flat(inputs: keras.KerasTensor, in_shape: tuple[int, ...]) -> keras.KerasTensor:
    """Inputs of rank > 1 flattened to one feature vector per sample."""
    return keras.layers.Flatten(name="flatten")(inputs) if len(in_shape) > 1 else inputs


def _head(
    inputs: keras.KerasTensor,
    features: keras.KerasTensor,
    out_shape: tuple[int, ...],
    activation: str | None,
    name: str,
) -> keras.Model:
    """Close the network with a float32 Dense "output" (reshaped when the output rank > 1).

    For outputs of rank > 1 the activation follows the reshape, so that softmax normalises
    each row of the last axis (one distribution per output row), not the whole output.
    """
    rank1 = len(out_shape) == 1
    x = keras.layers.Dense(
        math.prod(out_shape), activation=activation if rank1 else None, dtype="float32",
        name="output",
    )(features)  # fmt: skip
    if not rank1:
        x = keras.layers.Reshape(out_shape, dtype="float32", name="output_reshape")(x)
        if activation is not None:
            x = keras.layers.Activation(activation, dtype="float32", name="output_activation")(x)
    return keras.Model(inputs, x, name=name)


def _build_linear(
    in_shape: tuple[int, ...], out_shape: tuple[int, ...], output_activation: str | None
) -> keras.Model:
    """One Dense from the (flattened) inputs to the outputs."""
    inputs = _inputs(in_shape)
    return _head(inputs, _flat(inputs, in_shape), out_shape, output_activation, "linear")


def _build_mlp(
    in_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    hidden_units: Sequence[int],
    activation: str,
    dropout: float,
    output_activation: str | None,
) -> keras.Model:
    """Dense layers "hidden_0", "hidden_1", ..., each followed by dropout when it is > 0."""
    if not isinstance(hidden_units, Sequence) or isinstance(hidden_units, str):
        raise ValueError(
            f"builder 'mlp': option 'hidden_units' must be a list, got {hidden_units!r}"
        )
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"builder 'mlp': option 'dropout' must be in [0, 1), got {dropout!r}")
    inputs = _inputs(in_shape)
    x = _flat(inputs, in_shape)
    for i, units in enumerate(hidden_units):
        units = _positive_int("mlp", "hidden_units", units)
        x = keras.layers.Dense(units, activation=activation, name=f"hidden_{i}")(x)
        if dropout > 0:
            x = keras.layers.Dropout(dropout, name=f"dropout_{i}")(x)
    return _head(inputs, x, out_shape, output_activation, "mlp")


def _build_lstm(
    in_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    units: int,
    layers: int,
    output_activation: str | None,
) -> keras.Model:
    """Stacked LSTMs "lstm_0", ... over ``[timesteps, features]``; the last returns its state."""
    if len(in_shape) != 2:
        raise ValueError(
            f"builder 'lstm' needs input_shape [timesteps, features], got {list(in_shape)}"
        )
    units = _positive_int("lstm", "units", units)
    layers = _positive_int("lstm", "layers", layers)
    inputs = _inputs(in_shape)
    x = inputs
    for i in range(layers):
        x = keras.layers.LSTM(units, return_sequences=i < layers - 1, name=f"lstm_{i}")(x)
    return _head(inputs, x, out_shape, output_activation, "lstm")


# Layers that pass their input's values through (for ``output_activation_name``).
_PASS_THROUGH = (
    keras.layers.Reshape,
    keras.layers.Flatten,
    keras.layers.Dropout,
    keras.layers.InputLayer,
)

_BUILTINS: dict[str, Callable[..., keras.Model]] = {
    "linear": _build_linear,
    "mlp": _build_mlp,
    "lstm": _build_lstm,
}


def _load_builder(path: str) -> Callable[..., keras.Model]:
    """The function a ``package.module:function`` path names, or a ValueError naming the path."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(
            f"unknown builder {path!r}: use one of {', '.join(BUILTIN_BUILDERS)} "
            'or "package.module:function"'
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a user's module may fail on import in any way
        raise ValueError(f"cannot import builder {path!r}: {exc!r}") from exc
    function = getattr(module, attr, None)
    if not callable(function):
        raise ValueError(f"cannot import builder {path!r}: {module_name} has no callable {attr!r}")
    return function


def _check_custom_model(
    path: str, model: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> None:
    """Raise ValueError unless ``model`` is a one-input, one-output model of the declared shapes."""
    if not isinstance(model, keras.Model):
        raise ValueError(f"builder {path!r} returned {type(model).__name__}, not a keras.Model")
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if not inputs or not outputs or len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            f"builder {path!r} must return a model with one input and one output, "
            "built on keras.Input (functional or Sequential)"
        )
    actual_in, actual_out = tuple(inputs[0].shape[1:]), tuple(outputs[0].shape[1:])
    if (actual_in, actual_out) != (in_shape, out_shape):
        raise ValueError(
            f"builder {path!r} returned input shape {list(actual_in)} and output shape "
            f"{list(actual_out)}, expected input {list(in_shape)} and output {list(out_shape)}"
        )
