"""The trainer's metric families (``base.metrics``: a part claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..base.metrics import SIZE_BUCKETS, STEP_BUCKETS, MetricGroup


class TrainingMetrics(MetricGroup):
    """The trainer: steps, losses, prequential scores, steps rolled back, clipped targets."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.train_steps = Counter(
            "livefit_train_steps_total",
            "Gradient steps applied (a minibatch gets one or train.steps_per_batch; rolled-back "
            "steps are not counted)",
            ["model"],
            registry=registry,
        )
        self.train_samples = Counter(
            "livefit_train_samples_total", "Samples trained on", ["model"], registry=registry
        )
        self.train_batch_size = Histogram(
            "livefit_train_batch_size",
            "New samples per minibatch (not counting the replayed ones its steps add)", ["model"],
            buckets=SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.train_yield_seconds = Counter(
            "livefit_train_yield_seconds", "Time the trainer waited for queued predictions",
            ["model"], registry=registry,
        )  # fmt: skip
        self.train_batch_seconds = Histogram(
            "livefit_train_batch_seconds",
            "Wall time of one minibatch: its prequential scores and every step on it",
            ["model"], buckets=STEP_BUCKETS, registry=registry,
        )  # fmt: skip
        # the name before "step" meant one gradient step: kept, deprecated, for one release
        self.train_step_seconds = Histogram(
            "livefit_train_step_seconds",
            "Deprecated alias of livefit_train_batch_seconds (it times a minibatch, not a "
            "gradient step); removed after livefit 0.1",
            ["model"], buckets=STEP_BUCKETS, registry=registry,
        )  # fmt: skip
        self.train_loss = Gauge(
            "livefit_train_loss",
            "Training loss of the last minibatch (its first step, before the update)",
            ["model"],
            registry=registry,
        )
        self.prequential_loss = Gauge(
            "livefit_prequential_loss",
            "Test-then-train loss: mean over the last prequential_window samples, each scored "
            "before the model trained on it",
            ["model"],
            registry=registry,
        )
        self.prequential_accuracy = Gauge(
            "livefit_prequential_accuracy",
            "Test-then-train accuracy over the last prequential_window samples (classifiers)",
            ["model"],
            registry=registry,
        )
        self.prequential_score = Gauge(
            "livefit_prequential_score",
            "Test-then-train scores: loss, and accuracy and log_loss (classifiers) or mse and "
            "mae (regression), over the sliding window or since the start (cumulative)",
            ["model", "metric", "window"],
            registry=registry,
        )
        self.train_nonfinite = Counter(
            "livefit_train_nonfinite_total",
            "Training steps rolled back because the loss, gradients, predictions or the updated "
            "weights were not finite",
            ["model"],
            registry=registry,
        )
        self.train_outliers = Counter(
            "livefit_train_outliers_total",
            "Samples whose regression target lay beyond train.target_outlier_std standard "
            "deviations of the running target statistics, clipped to that bound and not "
            "learned (weight 0)",
            ["model"],
            registry=registry,
        )
        self.train_rewinds = Counter(
            "livefit_train_rewinds_total",
            "Steps the pipelined trainer (train.pipeline) started before the step ahead of "
            "them was finished and ran again, that step having been rolled back or brought a "
            "drift reaction",
            ["model"],
            registry=registry,
        )
        self.train_target_shifts = Counter(
            "livefit_train_target_shifts_total",
            "Changes of level of a regression target: 20 of the last 32 targets beyond the "
            "outlier bound on one side, the target statistics re-centred on them",
            ["model"],
            registry=registry,
        )

        self.expert_weight = Gauge(
            "livefit_expert_weight",
            "Each expert's share of the served mixture (experts.enabled: the configured network "
            "and the linear expert; they sum to 1)",
            ["model", "expert"],
            registry=registry,
        )
        self.expert_error = Gauge(
            "livefit_expert_error",
            "Each expert's recent prequential error per sample, discounted by experts.decay: "
            "the share of wrong predictions for a classifier, the absolute error in standard "
            "deviations of the target (its units without target scaling) otherwise",
            ["model", "expert"],
            registry=registry,
        )

    def init_model(self, model: str) -> None:
        self.train_steps.labels(model=model)
        self.train_samples.labels(model=model)
        self.train_yield_seconds.labels(model=model)
        self.train_nonfinite.labels(model=model)
        self.train_rewinds.labels(model=model)
        self.train_outliers.labels(model=model)
        self.train_target_shifts.labels(model=model)


class TrainingStateMetrics(MetricGroup):
    """Replay, drift, and the version and samples of the trainer's weights."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.replayed_samples = Counter(
            "livefit_replayed_samples_total", "Replayed samples mixed into training steps",
            ["model"], registry=registry,
        )  # fmt: skip
        self.replay_fill = Gauge(
            "livefit_replay_buffer_fill_ratio", "How full the replay buffer is (0 to 1)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.drift_detected = Counter(
            "livefit_drift_detected_total", "Drifts the detector found in the prequential loss",
            ["model"], registry=registry,
        )  # fmt: skip
        self.model_version = Gauge(
            "livefit_model_version", "Training steps in the trainer's weights", ["model"],
            registry=registry,
        )  # fmt: skip
        self.model_samples = Gauge(
            "livefit_model_samples",
            "Samples trained into the current weights' lineage (restored from checkpoints)",
            ["model"],
            registry=registry,
        )

    def init_model(self, model: str) -> None:
        self.model_version.labels(model=model)


class CheckpointMetrics(MetricGroup):
    """Checkpoints: written, their time, size and stalls, and those set aside."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.checkpoints = Counter(
            "livefit_checkpoints_total", "Checkpoints written, by outcome (ok or failed)",
            ["model", "outcome"], registry=registry,
        )  # fmt: skip
        self.checkpoint_seconds = Histogram(
            "livefit_checkpoint_seconds", "Time to write one checkpoint (in the background)",
            ["model"], buckets=STEP_BUCKETS, registry=registry,
        )  # fmt: skip
        self.checkpoint_stall_seconds = Histogram(
            "livefit_checkpoint_stall_seconds",
            "Time the trainer paused to copy its state for a checkpoint",
            ["model"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=registry,
        )
        self.checkpoint_bytes = Gauge(
            "livefit_checkpoint_bytes",
            "Size of the last checkpoint file",
            ["model"],
            registry=registry,
        )
        self.checkpoints_set_aside = Counter(
            "livefit_checkpoints_set_aside_total",
            "Checkpoints that failed their checksum at start, renamed *.corrupt and not used",
            ["model"], registry=registry,
        )  # fmt: skip


class SelectionMetrics(MetricGroup):
    """Online model selection: each candidate's windowed score, which is served, switches."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.selection_score = Gauge(
            "livefit_selection_score",
            "Each candidate's prequential loss over the last selection.window samples (NaN "
            "before its first batch or within a window of a failed one); the lowest is served",
            ["model", "candidate"],
            registry=registry,
        )
        self.selection_served = Gauge(
            "livefit_selection_served",
            "1 for the candidate whose weights are served, 0 for the others",
            ["model", "candidate"],
            registry=registry,
        )
        self.selection_switches = Counter(
            "livefit_selection_switches_total",
            "Times the served candidate changed (online model selection)",
            ["model"],
            registry=registry,
        )
