"""What a model's output must be for its loss: output activation and target scaling.

Keras-free, so that ``livefit.server.config`` rejects a combination that cannot train when it
loads a file, before TensorFlow is up; ``livefit.models.builders`` applies the same rules when
it builds a network, and ``livefit.server.train.modeling`` warns with them about custom builders.

- **Classifiers.** Keras' cross-entropies take probabilities: a linear output under
  ``binary_crossentropy`` is clipped to [1e-7, 1 - 1e-7] and gets no gradient outside [0, 1].
  A built-in builder whose ``output_activation`` is left out therefore ends in ``sigmoid`` for
  binary cross-entropy and ``softmax`` for (sparse) categorical cross-entropy, so that served
  predictions are probabilities. Training still works on logits: Keras' cross-entropies take
  the logits cached on a sigmoid or softmax output (``keras.activations`` keeps them) and use
  ``sigmoid_cross_entropy_with_logits`` / log-softmax, so a saturated wrong prediction keeps
  its full gradient (``tests/unit/models/test_outputs.py`` checks this through the train step).
- **Regression.** Losses that commute with shifting and scaling the target (MSE, MAE, Huber,
  log-cosh) get online target standardization by default (``target_scaling``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

LossKind = Literal["binary", "categorical", "sparse", "regression", "other"]

# The Keras names (livefit.models.names.LOSSES) of each kind.
BINARY_LOSSES = frozenset({
    "binary_crossentropy", "bce", "BCE", "BinaryCrossentropy", "binary_focal_crossentropy",
    "BinaryFocalCrossentropy",
})  # fmt: skip
CATEGORICAL_LOSSES = frozenset({
    "categorical_crossentropy", "CategoricalCrossentropy", "categorical_focal_crossentropy",
    "CategoricalFocalCrossentropy",
})  # fmt: skip
SPARSE_LOSSES = frozenset({"sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"})
# Losses with loss(a*y + b, a*p + b) a function of loss(y, p): training on the standardized
# target fits the same model in the user's units (Huber's delta is then in standard deviations).
REGRESSION_LOSSES = frozenset({
    "mse", "MSE", "mean_squared_error", "MeanSquaredError", "mae", "MAE",
    "mean_absolute_error", "MeanAbsoluteError", "huber", "Huber", "log_cosh", "LogCosh",
})  # fmt: skip

TARGET_SCALINGS = ("standardize", "none")
_EXPECTED = {"binary": "sigmoid", "categorical": "softmax", "sparse": "softmax"}


def loss_kind(loss: str) -> LossKind:
    """``binary``, ``categorical``, ``sparse`` (class index targets), ``regression`` or
    ``other`` (hinge, Poisson, KL divergence, ...: livefit makes no choice for those)."""
    if loss in BINARY_LOSSES:
        return "binary"
    if loss in CATEGORICAL_LOSSES:
        return "categorical"
    if loss in SPARSE_LOSSES:
        return "sparse"
    if loss in REGRESSION_LOSSES:
        return "regression"
    return "other"


def default_output_activation(loss: str) -> str | None:
    """The output activation a built-in builder uses when none is set: sigmoid for binary
    cross-entropy, softmax for (sparse) categorical cross-entropy, else linear (None)."""
    return _EXPECTED.get(loss_kind(loss))


def output_problem(loss: str, activation: str | None, output_shape: Sequence[int]) -> str | None:
    """Why a built-in network ending in ``activation`` cannot train under ``loss``, or None.

    The message names the configuration keys, ``builder_options.output_activation`` and
    ``loss`` (or ``output_shape``).
    """
    classes = output_shape[-1] if output_shape else 1
    kind = loss_kind(loss)
    shown = "linear" if activation is None else activation
    if kind in ("categorical", "sparse") and classes < 2:
        return (
            f"loss = {loss!r} with output_shape {list(output_shape)}: a categorical loss needs "
            "one output per class (at least 2); for two classes use output_shape = [1] with "
            'loss = "binary_crossentropy"'
        )
    if activation == "softmax" and classes < 2:
        return (
            f'builder_options.output_activation = "softmax" with output_shape '
            f"{list(output_shape)}: a softmax over one unit is always 1, it cannot learn; "
            'use "sigmoid" with loss = "binary_crossentropy" for two classes'
        )
    expected = _EXPECTED.get(kind)
    if expected is not None and activation != expected:
        return (
            f"builder_options.output_activation = {shown!r} does not fit loss = {loss!r}: the "
            f"loss takes probabilities, which a {shown} output is not (Keras clips it and the "
            f'gradient vanishes); use "{expected}" or leave output_activation out (livefit then '
            f"uses {expected} and trains on its logits)"
        )
    return None


def custom_output_problem(loss: str, activation: str | None, target_scaling: str) -> str | None:
    """Why a custom network whose output layer has ``activation`` does not fit ``loss`` (a
    warning: livefit cannot change a user's network), or None. ``activation`` is the name of
    the last layer's activation, None when it cannot be told."""
    kind = loss_kind(loss)
    expected = _EXPECTED.get(kind)
    if activation is None:
        if expected is None:
            return None
        return (
            f"cannot tell the output activation of the custom network; loss = {loss!r} takes "
            f"probabilities: make its last layer a {expected}"
        )
    if expected is not None and activation != expected:
        return (
            f"the custom network's output activation is {activation!r}, but loss = {loss!r} "
            f"takes probabilities: end it in {expected} (Keras trains a {expected} output on "
            "its logits); predictions and prequential accuracy and log loss are computed on "
            "what the network outputs"
        )
    bounded = {"sigmoid", "tanh", "softmax", "hard_sigmoid", "hard_tanh", "softsign"}
    if target_scaling == "standardize" and activation in bounded:
        return (
            f"the custom network's output activation {activation!r} is bounded, but with "
            f'target_scaling = "standardize" (the default for loss = {loss!r}) it is trained '
            "on standardized targets (mean 0, standard deviation 1): set "
            'target_scaling = "none" or end it in a linear layer'
        )
    return None


def default_target_scaling(
    loss: str, target_shape: Sequence[int] | None = None, output_shape: Sequence[int] = ()
) -> str:
    """``standardize`` for regression losses (when a target has as many values as an output),
    else ``none``."""
    if loss_kind(loss) != "regression":
        return "none"
    if target_shape is not None and math.prod(target_shape) != math.prod(output_shape):
        return "none"
    return "standardize"


def target_scaling_problem(
    loss: str,
    target_scaling: str,
    target_shape: Sequence[int] | None = None,
    output_shape: Sequence[int] = (),
) -> str | None:
    """Why ``target_scaling`` cannot go with ``loss`` (and the shapes), or None."""
    if target_scaling not in TARGET_SCALINGS:
        return f'target_scaling must be "standardize" or "none", got {target_scaling!r}'
    if target_scaling == "none":
        return None
    if loss_kind(loss) != "regression":
        return (
            f'target_scaling = "standardize" does not fit loss = {loss!r}: only losses that '
            f"shift and scale with the target can be trained on a standardized target "
            f"({', '.join(sorted(r for r in REGRESSION_LOSSES if r.islower()))}); "
            'set target_scaling = "none"'
        )
    if target_shape is not None and math.prod(target_shape) != math.prod(output_shape):
        return (
            f'target_scaling = "standardize" needs a target of the output\'s size: target_shape '
            f"{list(target_shape)}, output_shape {list(output_shape)}"
        )
    return None
