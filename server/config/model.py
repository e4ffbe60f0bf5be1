"""One model's settings (``ModelSettings``): its network, loss and optimizer (names checked
without importing Keras), shapes, topics and ingestion limits, with its sub-tables from
``config.model_tables``, and the checks that need several keys at once (an output that fits
the loss, a default label of the target's shape).

This module owns ``ModelSettings`` and the builder names; ``config`` re-exports them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from livefit.models import names
from livefit.models.names import BUILTIN_BUILDERS
from livefit.models.outputs import (
    default_output_activation,
    default_target_scaling,
    loss_kind,
    output_problem,
    target_scaling_problem,
)

from .model_tables import (
    CONFIGURED_CANDIDATE,
    CheckpointSettings,
    DriftSettings,
    ExpertsSettings,
    GuardSettings,
    LabelsSettings,
    SelectionSettings,
    ServeSettings,
    TrainSettings,
    VersionsSettings,
    WeightsSettings,
)
from .sections import Section
from .topic_filters import (
    PUBLISHED_TOPIC_RULES,
    REFUSED_TOPIC_CHARACTERS,
    checked_topic,
    filter_problem,
    shown_topic,
)

# Gradient steps per caught-up minibatch when train.steps_per_batch is unset, for regression
# losses and for the others: see TrainSettings.steps_per_batch.
REGRESSION_STEPS_PER_BATCH, STEPS_PER_BATCH = 4, 2
# Samples kept for replay when train.replay_capacity is unset, for regression losses and for
# the others: see TrainSettings.replay_capacity.
REGRESSION_REPLAY_CAPACITY, REPLAY_CAPACITY = 2000, 500
# Samples a fresh model learns in its fast start's growing batches when
# train.fast_start_samples is unset, for regression losses and for the others: see
# TrainSettings.fast_start_samples.
REGRESSION_FAST_START_SAMPLES, FAST_START_SAMPLES = 100, 0
# An unset train.replay_capacity also keeps the buffer within this many bytes (float32 inputs,
# targets and sample weights): a model with large inputs replays from fewer samples than its
# loss's default (a 224x224x3 image is 602 kB a sample: 445 samples, not 2,000 or 500). A set
# capacity is kept whatever its size.
REPLAY_DEFAULT_BYTES = 256 * 2**20
_BUILDER_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ModelSettings(Section):
    """One model: its network, its training stream and its serving limits."""

    builder: str = Field(
        "mlp",
        description=(
            "`linear`, `mlp`, `lstm` or `package.module:function` (called with `input_shape`, "
            "`output_shape` and `builder_options`, returns a `keras.Model`); a module that cannot "
            "be found on the Python path is an error when the file loads, with the nearest names "
            "in its package"
        ),
    )
    builder_options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "`linear`: `output_activation`; `mlp`: `hidden_units` ([64, 64]), `activation` "
            '("tanh"; chosen by the learning-quality benchmark), `dropout` (0), '
            "`output_activation`; `lstm`: `units` (32), `layers` (1), `output_activation`. An "
            "unknown option or activation name (`keras.activations`: `relu`, `tanh`, `sigmoid`, "
            "`softmax`, ...) is an error when the file loads; a custom builder's options are its "
            "own to check. `output_activation` left out: `sigmoid` for binary cross-entropy, "
            "`softmax` for (sparse) categorical cross-entropy (one distribution per row of the "
            "last axis), linear otherwise; one that cannot train under the loss (a linear or "
            "`relu` output under a cross-entropy, a softmax over one unit, a categorical loss with "
            "one output) is an error naming both keys. A custom builder whose output does not fit "
            "the loss is logged as a warning at start"
        ),
    )
    input_shape: list[int] = Field(
        description="shape of one input, e.g. `[8]`, or `[T, F]` for `lstm`",
    )
    output_shape: list[int] = Field(description="shape of one output")
    target_shape: list[int] | None = Field(
        None,
        description=(
            "shape of one label; `[]` by default for sparse categorical losses (class index)"
        ),
        json_schema_extra={"unset": "the output shape; `[]` for sparse categorical losses"},
    )
    loss: str = Field(
        "mse",
        description=(
            "any Keras loss name (`mse`, `mae`, `binary_crossentropy`, "
            "`sparse_categorical_crossentropy`, ...), as `keras.losses.get` takes it (case "
            "matters); checked when the file loads"
        ),
    )
    # why: nadam at 0.01 is the learning-quality sweep's choice (BENCHMARKS.md#learning-quality)
    optimizer: str = Field(
        "nadam",
        description=(
            "any Keras optimizer name (any case; checked when the file loads); the default was "
            "chosen by the [learning-quality benchmark](../BENCHMARKS.md#learning-quality)"
        ),
    )
    learning_rate: float = Field(
        0.01,
        gt=0,
        description=(
            "chosen with the optimizer: nadam at 0.01 beat adam at 0.001 on every stream of the "
            "[learning-quality benchmark](../BENCHMARKS.md#learning-quality)"
        ),
    )
    metrics: list[str] = Field(
        default_factory=list,
        description=(
            '`["accuracy"]` marks a classifier (also implied by a cross-entropy loss): '
            "prequential accuracy and log loss instead of MSE and MAE"
        ),
    )
    scaling: Literal["none", "standardize"] = Field(
        "standardize",
        description=(
            "online per-feature scaling: running mean and variance (Chan's parallel update, "
            "float64) of the inputs, applied by a `standardize` layer inside the model, so that "
            "serving, replicas and `WeightSubscriber` predict exactly what the learner does; for "
            "`lstm` inputs per feature F pooled over time. Over fewer than 10 values (a stream's "
            "first single-sample messages) a feature's standard deviation is raised to its 95 % "
            "upper confidence bound: one estimated from 2 values can be a small fraction of the "
            "true one, and inputs divided by it stalled learning for thousands of samples. "
            '`"none"` feeds raw inputs'
        ),
    )
    target_scaling: Literal["standardize", "none"] | None = Field(
        None,
        description=(
            "online target standardization: the network learns `(y - mean) / std` with the running "
            "mean and variance of the targets (per output, new samples only, the statistics "
            "including each batch), and a last `target_scaling` layer maps its output back, so "
            "that predictions (served, replicas, `WeightSubscriber`), prequential scores and the "
            "reported loss are in the targets' units; the statistics are weights of the model and "
            'travel with every snapshot and checkpoint. `"none"`: the network learns the raw '
            "targets (and keeps the weights of models trained before this setting existed: the two "
            "statistics are weights, so checkpoints and snapshots of one setting do not load into "
            'the other). `"standardize"` with another loss (cross-entropies, `poisson`, `msle`, '
            "...) is an error"
        ),
        json_schema_extra={
            "unset": (
                '`"standardize"` for `mse`, `mae`, `huber`, `log_cosh` (any spelling); else '
                '`"none"`'
            ),
        },
    )
    device: str = Field(
        "auto",
        description=(
            "`/GPU:0` when TensorFlow sees a GPU, else `/CPU:0`; or any TensorFlow device string"
        ),
    )
    topic: str | None = Field(
        None,
        description=(
            "samples subscription (wildcards `+`/`#` allowed; at most 65,535 UTF-8 bytes; "
            + REFUSED_TOPIC_CHARACTERS
            + (
                " is refused at load). MQTT 5 shared subscriptions (`$share/<group>/...`) are not "
                "supported and refused at load, as is any `$` topic: one learner takes a model's "
                "whole stream (two learners of one model would split the samples and fight over "
                "its weight topic). A filter that matches a topic livefit publishes for any model "
                "(weights, dead-letter, events, prediction records, labels) is refused at load, "
                "naming the filter and the topic: a learner must not read its own output. The same "
                "holds for `labels.topic` and `labels.predictions_topic`, except for the one topic "
                "each exists to read"
            )
        ),
        json_schema_extra={"unset": "`livefit/<name>/samples`"},
    )
    dead_letter_topic: str | None = Field(
        None,
        description=("where rejected messages are reported" + PUBLISHED_TOPIC_RULES),
        json_schema_extra={"unset": "`livefit/<name>/rejected`"},
    )
    max_message_bytes: int = Field(
        1024 * 1024,
        ge=64,
        description="larger messages are rejected (`too_large`)",
    )
    max_samples_per_message: int = Field(
        10_000,
        ge=1,
        description="more samples in one message are rejected",
    )
    prequential_window: int = Field(
        1000,
        ge=1,
        description="samples in the sliding prequential score",
    )
    dedup: bool = Field(
        False,
        description=(
            "drop messages whose (`source`, `seq`) was already accepted (redeliveries after "
            "reconnects and crashes); tolerates out-of-order arrival; state saved in checkpoints"
        ),
    )
    stall_after_s: float = Field(
        30.0,
        gt=0,
        description=(
            "readiness fails (503, naming the model) while its messages have waited this long and "
            "none was accepted or rejected: a learner that is not learning says so"
        ),
    )
    silent_topic_warn_s: float = Field(
        60.0,
        ge=0,
        description=(
            "a warning naming the model, its samples topic and the broker user, with ACLs as the "
            "likely cause, once nothing has arrived on the topic this long after the learner "
            "subscribed (mosquitto grants a subscription its ACL forbids and delivers nothing); 0: "
            "off. A subscription the broker refuses outright (SUBACK failure) is an error at once"
        ),
    )
    seed: int | None = Field(
        None,
        description=(
            "makes a learner's run repeatable: seeds Python, NumPy and TensorFlow/Keras before the "
            "network is built (the initial weights) and the replay buffer's sampling; the same "
            "seed and the same minibatches give the same predictions, to the bit (on one machine "
            "and TensorFlow build). Unset: a fresh random start each time"
        ),
    )
    train: TrainSettings = TrainSettings()
    serve: ServeSettings = ServeSettings()
    weights: WeightsSettings = WeightsSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    labels: LabelsSettings = LabelsSettings()
    drift: DriftSettings = DriftSettings()
    selection: SelectionSettings = SelectionSettings()
    experts: ExpertsSettings = ExpertsSettings()
    versions: VersionsSettings = VersionsSettings()
    guard: GuardSettings = GuardSettings()

    @field_validator("builder")
    @classmethod
    def _check_builder(cls, value: str) -> str:
        if value not in BUILTIN_BUILDERS and not _BUILDER_PATH.match(value):
            raise ValueError(
                f"unknown builder {value!r}: use one of {', '.join(BUILTIN_BUILDERS)} "
                'or "package.module:function"'
            )
        if value not in BUILTIN_BUILDERS:
            names.check_builder_module(value)
        return value

    @field_validator("loss")
    @classmethod
    def _check_loss(cls, value: str) -> str:
        names.check_loss(value)  # the names keras.losses.get takes, without importing Keras
        return value

    @field_validator("optimizer")
    @classmethod
    def _check_optimizer(cls, value: str) -> str:
        names.check_optimizer(value)
        return value

    @field_validator("metrics")
    @classmethod
    def _check_metrics(cls, value: list[str]) -> list[str]:
        for name in value:
            if name != "accuracy":
                raise ValueError(f"unknown metric {name!r}{names.suggest(name, ['accuracy'])}")
        return value

    @field_validator("builder_options")
    @classmethod
    def _check_builder_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        names.check_builder_options(info.data.get("builder", ""), value)
        return value

    @field_validator("input_shape", "output_shape")
    @classmethod
    def _check_shape(cls, value: list[int]) -> list[int]:
        if not value or any(d < 1 for d in value):
            raise ValueError("must be a non-empty list of positive ints")
        return value

    @field_validator("dead_letter_topic")
    @classmethod
    def _check_publish_topic(cls, value: str | None) -> str | None:
        return checked_topic(value)

    @field_validator("target_shape")
    @classmethod
    def _check_target_shape(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(d < 1 for d in value):
            raise ValueError("must be a list of positive ints ([] for a scalar target)")
        return value

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("$share/"):
            raise ValueError(
                "shared subscriptions ($share/<group>/...) are not supported: one learner takes "
                "a model's whole stream (two learners of one model would split the samples and "
                "fight over its weight topic)"
            )
        if value is not None and value.startswith("$"):
            raise ValueError("a topic starting with '$' is the broker's own ($SYS/...), not data")
        problem = filter_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(f"{shown_topic(value)} is not an MQTT topic filter: {problem}")
        return value

    @model_validator(mode="after")
    def _check_output_fits_loss(self) -> ModelSettings:
        """A built-in network's output activation, and the target scaling, must fit the loss
        (livefit.models.outputs): a combination that cannot train is an error naming both."""
        if self.target_scaling is not None:
            problem = target_scaling_problem(
                self.loss, self.target_scaling, self.resolved_target_shape(), self.output_shape
            )
            if problem is not None:
                raise ValueError(problem)
        if self.builder in BUILTIN_BUILDERS:
            activation = self.builder_options.get("output_activation")
            if activation is None:
                activation = default_output_activation(self.loss)
            problem = output_problem(self.loss, activation, self.output_shape)
            if problem is not None:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_default_label(self) -> ModelSettings:
        """``labels.default_y`` must be a label of the model's target shape."""
        default = self.labels.default_y
        if default is None:
            return self
        shape = self.resolved_target_shape()
        try:
            array = np.asarray(default, dtype=np.float32)
        except (ValueError, TypeError):
            raise ValueError("labels.default_y must be a number or a list of numbers") from None
        if array.size != math.prod(shape) or not np.isfinite(array).all():
            raise ValueError(
                f"labels.default_y must be {math.prod(shape)} finite number(s), the target "
                f"shape {shape}; got {default!r}"
            )
        return self

    def candidate_settings(self, name: str) -> ModelSettings:
        """These settings with candidate ``name``'s optimizer, learning rate and seed
        (``configured``: these settings themselves)."""
        if name == CONFIGURED_CANDIDATE:
            return self
        for candidate in self.selection.candidates:
            if candidate.name == name:
                changes = candidate.model_dump(exclude={"name"}, exclude_none=True)
                return self.model_copy(update=changes)
        raise KeyError(f"no candidate {name!r} in selection.candidates")

    def resolved_steps_per_batch(self) -> int:
        """``train.steps_per_batch``, else 4 for regression losses, else 2."""
        if self.train.steps_per_batch is not None:
            return self.train.steps_per_batch
        regression = loss_kind(self.loss) == "regression"
        return REGRESSION_STEPS_PER_BATCH if regression else STEPS_PER_BATCH

    def resolved_fast_start_samples(self) -> int:
        """``train.fast_start_samples``, else 100 for regression losses, else 0 (off)."""
        if self.train.fast_start_samples is not None:
            return self.train.fast_start_samples
        regression = loss_kind(self.loss) == "regression"
        return REGRESSION_FAST_START_SAMPLES if regression else FAST_START_SAMPLES

    def resolved_replay_capacity(self) -> int:
        """``train.replay_capacity``, else 2,000 for regression losses and 500 for the others,
        at most as many samples as ``REPLAY_DEFAULT_BYTES`` hold (at least one)."""
        if self.train.replay_capacity is not None:
            return self.train.replay_capacity
        regression = loss_kind(self.loss) == "regression"
        capacity = REGRESSION_REPLAY_CAPACITY if regression else REPLAY_CAPACITY
        values = math.prod(self.input_shape) + math.prod(self.resolved_target_shape()) + 1
        return max(1, min(capacity, REPLAY_DEFAULT_BYTES // (4 * values)))

    def resolved_experts(self) -> bool:
        """Whether the model is built with experts: ``experts.enabled``, for a loss whose kind
        livefit knows (binary, categorical, sparse categorical or regression)."""
        return self.experts.enabled and loss_kind(self.loss) != "other"

    def resolved_target_scaling(self) -> str:
        """``target_scaling``, else ``standardize`` for regression losses, else ``none``."""
        if self.target_scaling is not None:
            return self.target_scaling
        return default_target_scaling(self.loss, self.resolved_target_shape(), self.output_shape)

    def resolved_target_shape(self) -> list[int]:
        """A label's shape: ``target_shape``, else [] for sparse categorical, else output_shape."""
        if self.target_shape is not None:
            return list(self.target_shape)
        if self.loss.startswith("sparse_categorical"):
            return []
        return list(self.output_shape)
