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
    LabelsSettings,
    SelectionSettings,
    ServeSettings,
    TrainSettings,
    WeightsSettings,
)
from .sections import Section
from .topic_filters import checked_topic, filter_problem, shown_topic

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

    builder: str = "mlp"
    builder_options: dict[str, Any] = Field(default_factory=dict)
    input_shape: list[int]
    output_shape: list[int]
    target_shape: list[int] | None = None  # default: output_shape ([] for sparse categorical)
    loss: str = "mse"
    # nadam at 0.01: measured best of the sweep in BENCHMARKS.md ("Learning quality") on all
    # three streams (adam at 0.001 trailed logistic regression by 5.8, 0.8 and 2.2 points).
    optimizer: str = "nadam"
    learning_rate: float = Field(0.01, gt=0)
    metrics: list[str] = Field(default_factory=list)
    scaling: Literal["none", "standardize"] = "standardize"  # online per-feature scaling
    # Online target standardization; None: "standardize" for regression losses (mse, mae,
    # huber, log_cosh), else "none" (see resolved_target_scaling).
    target_scaling: Literal["standardize", "none"] | None = None
    device: str = "auto"  # "auto" picks /GPU:0 when TensorFlow sees one, else /CPU:0
    topic: str | None = None
    dead_letter_topic: str | None = None
    max_message_bytes: int = Field(1024 * 1024, ge=64)
    max_samples_per_message: int = Field(10_000, ge=1)
    prequential_window: int = Field(1000, ge=1)
    dedup: bool = False  # drop messages whose (source, seq) was already accepted
    # Readiness fails while messages have waited this long with no message finished
    # (accepted or rejected): a learner that is not learning says so.
    stall_after_s: float = Field(30.0, gt=0)
    # Warn (a log line naming the topic, and ACLs as a likely cause) when the samples topic has
    # delivered nothing this long after the learner subscribed: a broker that grants a
    # subscription its ACL forbids (mosquitto does) delivers nothing and says nothing. 0: off.
    silent_topic_warn_s: float = Field(60.0, ge=0)
    seed: int | None = None
    train: TrainSettings = TrainSettings()
    serve: ServeSettings = ServeSettings()
    weights: WeightsSettings = WeightsSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    labels: LabelsSettings = LabelsSettings()
    drift: DriftSettings = DriftSettings()
    selection: SelectionSettings = SelectionSettings()
    experts: ExpertsSettings = ExpertsSettings()

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
