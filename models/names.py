"""The names Keras resolves for a model's config, without importing Keras.

``livefit.server.config`` checks ``loss``, ``optimizer`` and the built-in builders' options
(option keys, activation names) against these lists when it loads a file, so a typo fails at
once with the key and the nearest valid names instead of a traceback once TensorFlow is up.
The lists are the string identifiers that ``keras.losses.get``, ``keras.optimizers.get`` (as
``livefit.server.train.modeling`` calls them) and ``keras.activations.get`` (what ``Dense`` and
``LSTM`` call) accept in the Keras version livefit pins, minus abstract base classes that cannot
be built from a name alone; ``tests/unit/models/test_names.py`` compares them with the installed
Keras' own tables and resolves every name through those functions, so the lists cannot drift.
"""

from __future__ import annotations

import difflib
import importlib.util
import pkgutil
from collections.abc import Iterable, Mapping
from typing import Any

BUILTIN_BUILDERS = ("linear", "mlp", "lstm")  # what ``builders.build_model`` builds by name

# keras.losses.get(name): exact, case-sensitive lookup.
LOSSES: frozenset[str] = frozenset({
    "BCE", "BinaryCrossentropy", "BinaryFocalCrossentropy", "CTC", "CategoricalCrossentropy",
    "CategoricalFocalCrossentropy", "CategoricalHinge", "Circle", "CosineSimilarity", "Dice",
    "Hinge", "Huber", "KLD", "KLDivergence", "LogCosh", "MAE", "MAPE", "MSE", "MSLE",
    "MeanAbsoluteError", "MeanAbsolutePercentageError", "MeanSquaredError",
    "MeanSquaredLogarithmicError", "Poisson", "SparseCategoricalCrossentropy", "SquaredHinge",
    "Tversky", "bce", "binary_crossentropy", "binary_focal_crossentropy",
    "categorical_crossentropy", "categorical_focal_crossentropy", "categorical_hinge", "circle",
    "cosine_similarity", "ctc", "dice", "hinge", "huber", "kl_divergence", "kld", "log_cosh",
    "mae", "mape", "mean_absolute_error", "mean_absolute_percentage_error", "mean_squared_error",
    "mean_squared_logarithmic_error", "mse", "msle", "poisson", "sparse_categorical_crossentropy",
    "squared_hinge", "tversky",
})  # fmt: skip
LOSS_BASES: frozenset[str] = frozenset({"Loss", "LossFunctionWrapper"})

# keras.optimizers.get({"class_name": name, ...}): built-ins case-insensitively (lower case here).
OPTIMIZERS: frozenset[str] = frozenset({
    "adadelta", "adafactor", "adagrad", "adam", "adamax", "adamw", "ftrl", "lion", "muon",
    "nadam", "rmsprop", "schedulefreeadamw", "sgd",
})  # fmt: skip
OPTIMIZER_BASES: frozenset[str] = frozenset(
    {"optimizer", "multioptimizer", "optimizermap", "lossscaleoptimizer"}
)

# keras.activations.get(name): exact lookup; None (TOML: leave the option out) is linear.
ACTIVATIONS: frozenset[str] = frozenset({
    "celu", "elu", "exponential", "gelu", "glu", "hard_shrink", "hard_sigmoid", "hard_silu",
    "hard_swish", "hard_tanh", "leaky_relu", "linear", "log_sigmoid", "log_softmax", "mish",
    "relu", "relu6", "selu", "sigmoid", "silu", "soft_shrink", "softmax", "softplus", "softsign",
    "sparse_plus", "sparse_sigmoid", "sparsemax", "squareplus", "swish", "tanh", "tanh_shrink",
    "threshold",
})  # fmt: skip

# The built-in builders' options and defaults (livefit.models.builders uses this table).
BUILDER_OPTIONS: dict[str, dict[str, Any]] = {
    "linear": {"output_activation": None},
    "mlp": {
        "hidden_units": (64, 64),
        "activation": "tanh",
        "dropout": 0.0,
        "output_activation": None,
    },
    "lstm": {"units": 32, "layers": 1, "output_activation": None},
}
ACTIVATION_OPTIONS = ("activation", "output_activation")


def suggest(name: str, choices: Iterable[str]) -> str:
    """``; did you mean 'x' or 'y'?`` for the closest ``choices``, or a short list of them."""
    options = sorted(choices, key=lambda c: (c[:1].isupper(), c))  # snake_case names first
    lowered = name.lower()
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    close += [  # "mse_typo" -> "mse", "sparse" -> "sparse_categorical_crossentropy"
        c for c in options
        if len(c) >= 3 and (lowered.startswith(c.lower()) or c.lower().startswith(lowered))
    ]  # fmt: skip
    if len(close) < 3:
        by_case = {option.lower(): option for option in options}
        close += [by_case[c] for c in difflib.get_close_matches(lowered, list(by_case), n=3)]
    close = list(dict.fromkeys(close))[:3]
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    shown = ", ".join(options[:12]) + (", ..." if len(options) > 12 else "")
    return f"; valid names: {shown}"


def check_loss(name: str) -> None:
    """ValueError unless ``keras.losses.get(name)`` resolves it."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}{suggest(name, LOSSES)}")


def check_optimizer(name: str) -> None:
    """ValueError unless ``keras.optimizers.get`` resolves it by name.

    Names holding ``>`` (``"package>Name"``, Keras' registered custom objects) are left to
    Keras: they can only be resolved once the module registering them is imported.
    """
    if name.lower() not in OPTIMIZERS and ">" not in name:
        raise ValueError(f"unknown optimizer {name!r}{suggest(name.lower(), OPTIMIZERS)}")


def check_builder_module(path: str) -> None:
    """ValueError unless the module of a ``package.module:function`` builder can be found (its
    parent packages are imported, the module itself is not: its function is checked at start)."""
    module = path.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        found = False
    if found:
        return
    parent, _, leaf = module.rpartition(".")
    try:
        spec = importlib.util.find_spec(parent) if parent else None
    except (ImportError, ValueError):
        spec = None
    siblings = [info.name for info in pkgutil.iter_modules(spec.submodule_search_locations)] if (
        spec is not None and spec.submodule_search_locations
    ) else []  # fmt: skip
    hint = suggest(leaf, siblings) if siblings else " on the Python path"
    raise ValueError(f"unknown builder module {module!r} (from {path!r}){hint}")


def check_builder_options(builder: str, options: Mapping[str, Any]) -> None:
    """ValueError for an unknown option of a built-in builder or an unknown activation name.

    Other option values (types, ranges) are checked when the model is built; custom builders'
    options are theirs to check.
    """
    allowed = BUILDER_OPTIONS.get(builder)
    if allowed is None:
        return
    for key in options:
        if key not in allowed:
            raise ValueError(
                f"unknown option {key!r} for builder {builder!r}{suggest(key, allowed)}"
            )
    for key in ACTIVATION_OPTIONS:
        value = options.get(key)
        if value is None or key not in allowed:
            continue
        if not isinstance(value, str):
            raise ValueError(f"option {key!r} must be an activation name, got {value!r}")
        if value not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {value!r} for option {key!r}{suggest(value, ACTIVATIONS)}"
            )
