"""Build and compile a configured model, and pick the device it runs on."""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from livefit.models.builders import build_model, output_activation_name
from livefit.models.names import BUILTIN_BUILDERS
from livefit.models.outputs import custom_output_problem

from ..config.model import ModelSettings
from ..config.sections import TensorFlowSettings

log = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """``auto``: ``/GPU:0`` when TensorFlow sees a GPU, else ``/CPU:0``; others as given."""
    if device != "auto":
        return device
    return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


def enable_gpu_memory_growth() -> None:
    """Let several models (trainer and serving copies) share a GPU instead of one taking it all."""
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # already initialised: growth can no longer change
            log.debug("GPU memory growth could not be set on %s", gpu.name)


def make_optimizer(settings: ModelSettings) -> keras.optimizers.Optimizer:
    """The configured optimizer, with the configured learning rate."""
    try:
        return keras.optimizers.get(
            {"class_name": settings.optimizer, "config": {"learning_rate": settings.learning_rate}}
        )
    except ValueError as exc:
        raise ValueError(f"unknown optimizer {settings.optimizer!r}: {exc}") from None


def make_loss(settings: ModelSettings):
    """The configured loss as a per-sample function ``loss(y_true, y_pred)``."""
    try:
        return keras.losses.get(settings.loss)
    except ValueError as exc:
        raise ValueError(f"unknown loss {settings.loss!r}: {exc}") from None


def build_compiled(settings: ModelSettings, device: str) -> keras.Model:
    """Build the configured network on ``device`` and compile it with its loss and optimizer.

    A custom builder's network whose output does not fit the loss (a linear output under a
    cross-entropy, a bounded one under target scaling) is logged as a WARNING: built-in
    builders choose their output from the loss, but a user's network is theirs.
    """
    model = build_uncompiled(settings, device)
    if settings.builder not in BUILTIN_BUILDERS:
        problem = custom_output_problem(
            settings.loss, output_activation_name(model), settings.resolved_target_scaling()
        )
        if problem is not None:
            log.warning("model builder %s: %s", settings.builder, problem)
    with tf.device(device):
        model.compile(optimizer=make_optimizer(settings), loss=make_loss(settings))
    return model


def build_uncompiled(settings: ModelSettings, device: str) -> keras.Model:
    """The same network for serving: no optimizer state, weights set from snapshots."""
    with tf.device(device):
        return build_model(
            settings.builder,
            settings.input_shape,
            settings.output_shape,
            settings.builder_options,
            seed=settings.seed,
            scaling=settings.scaling,
            loss=settings.loss,
            target_scaling=settings.resolved_target_scaling(),
        )


def configure_tensorflow(settings: TensorFlowSettings) -> None:
    """Size TensorFlow's thread pools; call before the process runs its first TensorFlow op
    (TensorFlow refuses later changes: then this logs a warning and changes nothing)."""
    try:
        if settings.intra_op_threads:
            tf.config.threading.set_intra_op_parallelism_threads(settings.intra_op_threads)
        if settings.inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(settings.inter_op_threads)
    except RuntimeError as exc:
        log.warning("TensorFlow thread pools already set up; [tensorflow] ignored: %s", exc)
