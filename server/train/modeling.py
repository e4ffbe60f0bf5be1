"""Build and compile a configured model, and pick the devices it trains and serves on."""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from livefit.models.builders import build_model, output_activation_name
from livefit.models.description import MAX_DESCRIPTION_BYTES, describe, description_json
from livefit.models.names import BUILTIN_BUILDERS
from livefit.models.outputs import custom_output_problem, loss_kind

from ..config.model import ModelSettings
from ..config.sections import TensorFlowSettings
from ..config.settings import ConfigError
from .placement import Placement, as_placement
from .step_graph import ExpertsRule

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


def experts_rule(settings: ModelSettings) -> ExpertsRule | None:
    """How the model's experts learn and mix (``experts`` settings), None without experts."""
    if not settings.resolved_experts():
        return None
    experts = settings.experts
    return ExpertsRule(
        kind=loss_kind(settings.loss),
        decay=experts.decay,
        rate=experts.rate,
        linear_learning_rate=experts.linear_learning_rate,
        linear_rows=experts.linear_rows,
    )


def build_compiled(settings: ModelSettings, device: str | Placement) -> keras.Model:
    """Build the configured network on ``device`` (a device name, or a placement on several)
    and compile it with its loss and optimizer, their variables created in its scope.

    A custom builder's network whose output does not fit the loss (a linear output under a
    cross-entropy, a bounded one under target scaling) is logged as a WARNING: built-in
    builders choose their output from the loss, but a user's network is theirs.
    """
    placement = as_placement(device)
    with placement.scope():
        model = _network(settings)
        model.compile(optimizer=make_optimizer(settings), loss=make_loss(settings))
    if settings.builder not in BUILTIN_BUILDERS:
        problem = custom_output_problem(
            settings.loss, output_activation_name(model), settings.resolved_target_scaling()
        )
        if problem is not None:
            log.warning("model builder %s: %s", settings.builder, problem)
    return model


def build_uncompiled(settings: ModelSettings, device: str) -> keras.Model:
    """The same network for serving: no optimizer state, weights set from snapshots."""
    with tf.device(device):
        return _network(settings)


def network_description(model: keras.Model, settings: ModelSettings) -> str:
    """``model``'s description as its snapshots carry it (``livefit.models.description``); ""
    with a warning when Keras cannot serialize it or it is over ``MAX_DESCRIPTION_BYTES``:
    then a process must build the network itself to use the weights."""
    builder = {
        "name": settings.builder,
        "options": dict(settings.builder_options),
        "scaling": settings.scaling,
        "target_scaling": settings.resolved_target_scaling(),
    }
    try:
        text = description_json(describe(model, loss=str(settings.loss), builder=builder))
    except Exception as exc:  # a custom layer without get_config, a value JSON cannot hold
        log.warning("model %s: its network cannot be described (%r); its snapshots carry no "
                    "description", model.name, exc)  # fmt: skip
        return ""
    if len(text.encode()) > MAX_DESCRIPTION_BYTES:
        log.warning("model %s: its description is %d bytes, over %d; its snapshots carry none",
                    model.name, len(text.encode()), MAX_DESCRIPTION_BYTES)  # fmt: skip
        return ""
    return text


def _network(settings: ModelSettings) -> keras.Model:
    return build_model(
        settings.builder,
        settings.input_shape,
        settings.output_shape,
        settings.builder_options,
        seed=settings.seed,
        scaling=settings.scaling,
        loss=settings.loss,
        target_scaling=settings.resolved_target_scaling(),
        experts=settings.resolved_experts(),
    )


def training_placement(tensorflow: TensorFlowSettings, model_device: str) -> Placement:
    """Where a model with ``device = model_device`` trains: that one device when it names
    one; else the devices ``tensorflow.devices`` lists, or with ``"auto"`` every visible GPU
    where there are two or more, else ``resolve_device("auto")``."""
    if model_device != "auto":
        return Placement([model_device])
    if tensorflow.devices != "auto":
        return Placement(list(tensorflow.devices))
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return Placement([_short_name(gpu.name) for gpu in gpus])
    return Placement([resolve_device("auto")])


def check_devices(tensorflow: TensorFlowSettings) -> None:
    """Raise ``ConfigError`` naming a device in ``tensorflow.devices`` that TensorFlow does not
    see (this initialises TensorFlow's devices: call after ``configure_tensorflow``)."""
    if tensorflow.devices == "auto":
        return
    seen = [_short_name(d.name) for d in tf.config.list_logical_devices()]
    missing = [name for name in tensorflow.devices if name not in seen]
    if missing:
        raise ConfigError(
            f"tensorflow.devices: {', '.join(missing)} not found; TensorFlow sees "
            f"{', '.join(seen) or 'no device'} (split the CPU with "
            "tensorflow.logical_cpu_devices to try several devices without GPUs)"
        )


def _short_name(name: str) -> str:
    """``/device:GPU:1`` (or a longer ``/job:...`` name) as ``/GPU:1``."""
    return "/" + name.rsplit("device:", 1)[-1]


def configure_tensorflow(settings: TensorFlowSettings) -> None:
    """Split the CPU into logical devices and size TensorFlow's thread pools; call before the
    process runs its first TensorFlow op (TensorFlow refuses later changes: then this logs a
    warning and changes nothing)."""
    if settings.logical_cpu_devices:
        split_cpu(settings.logical_cpu_devices)
    enable_gpu_memory_growth()  # before check_devices initialises the devices
    try:
        if settings.intra_op_threads:
            tf.config.threading.set_intra_op_parallelism_threads(settings.intra_op_threads)
        if settings.inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(settings.inter_op_threads)
    except RuntimeError as exc:
        log.warning("TensorFlow thread pools already set up; [tensorflow] ignored: %s", exc)
        return
    if settings.intra_op_threads or settings.inter_op_threads:
        log.info(
            "TensorFlow thread pools: intra-op %d, inter-op %d as set (0: TensorFlow's default)",
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        )


def split_cpu(count: int) -> None:
    """Make the CPU ``count`` logical devices, ``/CPU:0`` .. ``/CPU:<count-1>`` (for trying and
    testing several devices without GPUs); before TensorFlow initialises its devices."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError as exc:
        log.warning(
            "TensorFlow's devices already set up; tensorflow.logical_cpu_devices ignored: %s", exc
        )
