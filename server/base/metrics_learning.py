"""The metric families of the learner's pipeline, declared on ``Metrics`` (which inherits
``LearningMetrics``): the MQTT connection, ingestion (messages, samples, rejections, message
sequences, the training queue, storage health), training (steps, losses, prequential scores,
replay, drift) and durability (the sample log, checkpoints).

This module owns those families and the row-count and step-time buckets (``SIZE_BUCKETS``,
``STEP_BUCKETS``), which ``metrics_serving`` also uses. Each method ``_<group>`` creates the
families of one group (``metrics.GROUPS``) on no registry; ``Metrics.export`` puts a group on
the process's registry when a part that updates it claims it.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SIZE_BUCKETS = tuple(float(2**i) for i in range(14))  # 1 .. 8192 rows
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class LearningMetrics:
    """The broker, ingestion, training and durability metrics of ``Metrics``."""

    def _broker(self) -> None:
        """The metrics of the MQTT connection."""
        self.broker_connected = Gauge(
            "livefit_broker_connected", "1 while connected to the MQTT broker", registry=None
        )
        self.broker_connects = Counter(
            "livefit_broker_connects_total",
            "Successful MQTT connections (the first one and every reconnect)",
            registry=None,
        )
        self.broker_disconnects = Counter(
            "livefit_broker_disconnects_total", "Unexpected MQTT disconnections", registry=None
        )

    def _publish_refused(self) -> None:
        """Publishes that never reached a subscriber (every MQTT client of a process)."""
        self.broker_publish_refused = Counter(
            "livefit_broker_publish_refused_total",
            "Messages the broker refused (MQTT 5 PUBACK reason >= 0x80, e.g. an ACL) or that were "
            "not sent because their PUBLISH is over the broker's maximum packet size",
            ["topic", "reason"],
            registry=None,
        )

    def _ingestion(self) -> None:
        """The metrics of MQTT ingestion: messages, samples, rejections."""
        self.ingest_messages = Counter(
            "livefit_ingest_messages_total",
            "MQTT sample messages by outcome (accepted or rejected) and rejection reason",
            ["model", "outcome", "reason"],
            registry=None,
        )
        self.ingest_samples = Counter(
            "livefit_ingest_samples_total", "Samples accepted into the training queue",
            ["model"], registry=None,
        )  # fmt: skip
        self.dead_letters = Counter(
            "livefit_dead_letter_publishes_total",
            "Rejected messages reported on the dead-letter topic, by outcome (sent or failed)",
            ["model", "outcome"],
            registry=None,
        )

    def _ingest_sequence(self) -> None:
        """The metrics of numbered messages: duplicates, gaps, missing, stalls."""
        self.ingest_duplicates = Counter(
            "livefit_ingest_duplicates_total",
            "Messages dropped because their (source, seq) was already accepted (dedup on)",
            ["model"],
            registry=None,
        )
        self.ingest_seq_gaps = Counter(
            "livefit_ingest_seq_gaps_total",
            "Numbered messages given up on as never received (a gap older than the out-of-order "
            "window), with or without dedup",
            ["model"],
            registry=None,
        )
        self.ingest_seq_missing = Gauge(
            "livefit_ingest_seq_missing",
            "Numbered messages missing now: below the newest (source, seq) received and not "
            "received (yet); a late message fills its place",
            ["model"],
            registry=None,
        )
        self.ingest_stalled = Gauge(
            "livefit_ingest_stalled",
            "1 while messages wait longer than ingest_stall_after_s with no message finished",
            ["model"],
            registry=None,
        )
        self.ingest_seconds_since_message = Gauge(
            "livefit_ingest_seconds_since_message",
            "Seconds since a message last arrived on the model's samples topic (since its "
            "subscription when none has; 0 before the first connection)",
            ["model"],
            registry=None,
        )

    def _ingest_health(self) -> None:
        """The metrics of storage health and the training queue."""
        self.storage_errors = Counter(
            "livefit_storage_errors_total",
            "Failed storage operations (wal_open, wal_write, wal_fsync, checkpoint, "
            "version_mark); nothing that depended on them was acknowledged",
            ["op"],
            registry=None,
        )
        self.storage_healthy = Gauge(
            "livefit_storage_healthy", "0 while a storage operation keeps failing", registry=None
        )
        self.storage_healthy.set(1)
        self.queue_depth = Gauge(
            "livefit_queue_depth", "Samples waiting for the trainer", ["model"], registry=None
        )

    def _errors(self) -> None:
        """The count of unexpected exceptions a background component caught and survived."""
        self.internal_errors = Counter(
            "livefit_internal_errors_total",
            "Unexpected exceptions caught in a background component, which kept running",
            ["component"],
            registry=None,
        )

    def _training(self) -> None:
        """The metrics of the trainer: steps, losses, prequential scores."""
        self.train_steps = Counter(
            "livefit_train_steps_total",
            "Training steps (minibatches) run",
            ["model"],
            registry=None,
        )
        self.train_samples = Counter(
            "livefit_train_samples_total", "Samples trained on", ["model"], registry=None
        )
        self.train_batch_size = Histogram(
            "livefit_train_batch_size", "Samples per training step", ["model"],
            buckets=SIZE_BUCKETS, registry=None,
        )  # fmt: skip
        self.train_yield_seconds = Counter(
            "livefit_train_yield_seconds", "Time the trainer waited for queued predictions",
            ["model"], registry=None,
        )  # fmt: skip
        self.train_step_seconds = Histogram(
            "livefit_train_step_seconds", "Wall time of one training step (predict + train)",
            ["model"], buckets=STEP_BUCKETS, registry=None,
        )  # fmt: skip
        self.train_loss = Gauge(
            "livefit_train_loss", "Training loss of the last step", ["model"], registry=None
        )
        self.prequential_loss = Gauge(
            "livefit_prequential_loss",
            "Test-then-train loss: mean over the last prequential_window samples, each scored "
            "before the model trained on it",
            ["model"],
            registry=None,
        )
        self.prequential_accuracy = Gauge(
            "livefit_prequential_accuracy",
            "Test-then-train accuracy over the last prequential_window samples (classifiers)",
            ["model"],
            registry=None,
        )
        self.prequential_score = Gauge(
            "livefit_prequential_score",
            "Test-then-train scores: loss, and accuracy and log_loss (classifiers) or mse and "
            "mae (regression), over the sliding window or since the start (cumulative)",
            ["model", "metric", "window"],
            registry=None,
        )

    def _training_state(self) -> None:
        """The metrics of replay, drift and the model's version and readiness."""
        self.replayed_samples = Counter(
            "livefit_replayed_samples_total", "Replayed samples mixed into training steps",
            ["model"], registry=None,
        )  # fmt: skip
        self.replay_fill = Gauge(
            "livefit_replay_buffer_fill_ratio", "How full the replay buffer is (0 to 1)",
            ["model"], registry=None,
        )  # fmt: skip
        self.drift_detected = Counter(
            "livefit_drift_detected_total", "Drifts the detector found in the prequential loss",
            ["model"], registry=None,
        )  # fmt: skip
        self.model_version = Gauge(
            "livefit_model_version", "Training steps in the trainer's weights", ["model"],
            registry=None,
        )  # fmt: skip

    def _durability(self) -> None:
        """The metrics of the sample log, checkpoints and storage."""
        self.wal_commit_seconds = Histogram(
            "livefit_wal_commit_seconds", "Time to write and fsync one group of accepted messages",
            buckets=STEP_BUCKETS, registry=None,
        )  # fmt: skip
        self.wal_replayed_samples = Counter(
            "livefit_wal_replayed_samples_total",
            "Samples replayed from the write-ahead log at start (accepted before a crash)",
            ["model"],
            registry=None,
        )
        self.wal_corrupt_records = Counter(
            "livefit_wal_corrupt_records_total",
            "Records of the write-ahead log skipped at start because they failed their checksum "
            "with intact records after them (their samples were not replayed; each is logged "
            "with its segment and byte offset)",
            registry=None,
        )
        self.checkpoints = Counter(
            "livefit_checkpoints_total", "Checkpoints written, by outcome (ok or failed)",
            ["model", "outcome"], registry=None,
        )  # fmt: skip
        self.checkpoint_seconds = Histogram(
            "livefit_checkpoint_seconds", "Time to write one checkpoint (in the background)",
            ["model"], buckets=STEP_BUCKETS, registry=None,
        )  # fmt: skip
        self.checkpoint_stall_seconds = Histogram(
            "livefit_checkpoint_stall_seconds",
            "Time the trainer paused to copy its state for a checkpoint",
            ["model"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=None,
        )
        self.checkpoint_bytes = Gauge(
            "livefit_checkpoint_bytes", "Size of the last checkpoint file", ["model"], registry=None
        )
        self.checkpoints_set_aside = Counter(
            "livefit_checkpoints_set_aside_total",
            "Checkpoints that failed their checksum at start, renamed *.corrupt and not used",
            ["model"], registry=None,
        )  # fmt: skip
        self.model_samples = Gauge(
            "livefit_model_samples",
            "Samples trained into the current weights' lineage (restored from checkpoints)",
            ["model"],
            registry=None,
        )
        self.train_nonfinite = Counter(
            "livefit_train_nonfinite_total",
            "Training steps rolled back because the loss, gradients, predictions or the updated "
            "weights were not finite",
            ["model"],
            registry=None,
        )
        self.train_outliers = Counter(
            "livefit_train_outliers_total",
            "Samples whose regression target lay beyond train.target_outlier_std standard "
            "deviations of the running target statistics, clipped to that bound",
            ["model"],
            registry=None,
        )
