"""Every Prometheus metric livefit exports, created on one registry per app instance.

Names follow Prometheus conventions (base units, ``_total`` counters, ``_seconds``) and every
per-model series carries the label ``model``. Label values are bounded: model names come from
the config, rejection reasons from ``codec.REASONS``, HTTP codes from the few the API returns.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from livefit import __version__

SIZE_BUCKETS = tuple(float(2**i) for i in range(14))  # 1 .. 8192 rows
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
DELAY_BUCKETS = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 604800.0,
)  # fmt: skip


class Metrics:
    """The metric objects of one livefit process (learner or replica)."""

    def __init__(self, registry: CollectorRegistry | None = None, role: str = "learner") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(
            registry=r
        )  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=r)  # python_info
        self.build_info = Info("livefit_build", "livefit version and role", registry=r)
        self.build_info.info({"version": __version__, "role": role})
        for group in (
            self._broker, self._ingestion, self._training, self._serving,
            self._weight_stream, self._durability, self._labels, self._gpu,
        ):  # fmt: skip
            group(r)

    def _broker(self, r: CollectorRegistry) -> None:
        """The metrics of the MQTT connection."""
        self.broker_connected = Gauge(
            "livefit_broker_connected", "1 while connected to the MQTT broker", registry=r
        )
        self.broker_connects = Counter(
            "livefit_broker_connects_total",
            "Successful MQTT connections (the first one and every reconnect)",
            registry=r,
        )
        self.broker_disconnects = Counter(
            "livefit_broker_disconnects_total", "Unexpected MQTT disconnections", registry=r
        )

    def _ingestion(self, r: CollectorRegistry) -> None:
        """The metrics of MQTT ingestion: messages, samples, rejections, the queue."""
        self.ingest_messages = Counter(
            "livefit_ingest_messages_total",
            "MQTT sample messages by outcome (accepted or rejected) and rejection reason",
            ["model", "outcome", "reason"],
            registry=r,
        )
        self.ingest_samples = Counter(
            "livefit_ingest_samples_total", "Samples accepted into the training queue",
            ["model"], registry=r,
        )  # fmt: skip
        self.dead_letters = Counter(
            "livefit_dead_letter_publishes_total",
            "Rejected messages reported on the dead-letter topic, by outcome (sent or failed)",
            ["model", "outcome"],
            registry=r,
        )
        self.ingest_duplicates = Counter(
            "livefit_ingest_duplicates_total",
            "Messages dropped because their (source, seq) was already accepted (dedup on)",
            ["model"],
            registry=r,
        )
        self.ingest_seq_gaps = Counter(
            "livefit_ingest_seq_gaps_total",
            "Numbered messages given up on as never received (a gap older than the out-of-order "
            "window), with or without dedup",
            ["model"],
            registry=r,
        )
        self.ingest_seq_missing = Gauge(
            "livefit_ingest_seq_missing",
            "Numbered messages missing now: below the newest (source, seq) received and not "
            "received (yet); a late message fills its place",
            ["model"],
            registry=r,
        )
        self.ingest_stalled = Gauge(
            "livefit_ingest_stalled",
            "1 while messages wait longer than ingest_stall_after_s with no message finished",
            ["model"],
            registry=r,
        )
        self.storage_errors = Counter(
            "livefit_storage_errors_total",
            "Failed storage operations (wal_open, wal_write, wal_fsync, checkpoint, "
            "version_mark); nothing that depended on them was acknowledged",
            ["op"],
            registry=r,
        )
        self.storage_healthy = Gauge(
            "livefit_storage_healthy", "0 while a storage operation keeps failing", registry=r
        )
        self.storage_healthy.set(1)
        self.queue_depth = Gauge(
            "livefit_queue_depth", "Samples waiting for the trainer", ["model"], registry=r
        )
        self.internal_errors = Counter(
            "livefit_internal_errors_total",
            "Unexpected exceptions caught in a background component, which kept running",
            ["component"],
            registry=r,
        )

    def _training(self, r: CollectorRegistry) -> None:
        """The metrics of the trainer: steps, losses, scores, drift."""
        self.train_steps = Counter(
            "livefit_train_steps_total", "Training steps (minibatches) run", ["model"], registry=r
        )
        self.train_samples = Counter(
            "livefit_train_samples_total", "Samples trained on", ["model"], registry=r
        )
        self.train_batch_size = Histogram(
            "livefit_train_batch_size", "Samples per training step", ["model"],
            buckets=SIZE_BUCKETS, registry=r,
        )  # fmt: skip
        self.train_yield_seconds = Counter(
            "livefit_train_yield_seconds", "Time the trainer waited for queued predictions",
            ["model"], registry=r,
        )  # fmt: skip
        self.train_step_seconds = Histogram(
            "livefit_train_step_seconds", "Wall time of one training step (predict + train)",
            ["model"], buckets=STEP_BUCKETS, registry=r,
        )  # fmt: skip
        self.train_loss = Gauge(
            "livefit_train_loss", "Training loss of the last step", ["model"], registry=r
        )
        self.prequential_loss = Gauge(
            "livefit_prequential_loss",
            "Test-then-train loss: mean over the last prequential_window samples, each scored "
            "before the model trained on it",
            ["model"],
            registry=r,
        )
        self.prequential_accuracy = Gauge(
            "livefit_prequential_accuracy",
            "Test-then-train accuracy over the last prequential_window samples (classifiers)",
            ["model"],
            registry=r,
        )
        self.prequential_score = Gauge(
            "livefit_prequential_score",
            "Test-then-train scores: loss, and accuracy and log_loss (classifiers) or mse and "
            "mae (regression), over the sliding window or since the start (cumulative)",
            ["model", "metric", "window"],
            registry=r,
        )
        self.replayed_samples = Counter(
            "livefit_replayed_samples_total", "Replayed samples mixed into training steps",
            ["model"], registry=r,
        )  # fmt: skip
        self.replay_fill = Gauge(
            "livefit_replay_buffer_fill_ratio", "How full the replay buffer is (0 to 1)",
            ["model"], registry=r,
        )  # fmt: skip
        self.drift_detected = Counter(
            "livefit_drift_detected_total", "Drifts the detector found in the prequential loss",
            ["model"], registry=r,
        )  # fmt: skip
        self.model_version = Gauge(
            "livefit_model_version", "Training steps in the trainer's weights", ["model"],
            registry=r,
        )  # fmt: skip
        self.model_ready = Gauge(
            "livefit_model_ready", "1 once the model is built and warmed up", ["model"], registry=r
        )

    def _serving(self, r: CollectorRegistry) -> None:
        """The metrics of prediction serving: requests, batches, admission, connections."""
        self.predict_requests = Counter(
            "livefit_predict_requests_total", "Prediction requests by HTTP status code",
            ["model", "code"], registry=r,
        )  # fmt: skip
        self.predict_latency = Histogram(
            "livefit_predict_latency_seconds", "Whole prediction request time, parse to response",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.predict_queue_seconds = Histogram(
            "livefit_predict_queue_seconds", "Time a request waited in the batcher's queue",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.predict_batch_size = Histogram(
            "livefit_predict_batch_size", "Rows per model call (before padding)", ["model"],
            buckets=SIZE_BUCKETS, registry=r,
        )  # fmt: skip
        self.predict_queue_rows = Gauge(
            "livefit_predict_queue_rows", "Rows waiting in the batcher's queue", ["model"],
            registry=r,
        )  # fmt: skip
        self.serving_version = Gauge(
            "livefit_serving_version", "Version of the weights that answers predictions",
            ["model"], registry=r,
        )  # fmt: skip
        self.predict_refused = Counter(
            "livefit_predict_refused_total",
            "Prediction requests refused at admission (429), by reason: wait (expected wait "
            "over serve.max_queue_wait_ms), deadline (would finish after its deadline), rows "
            "(serve.max_queue_rows)",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.predict_batch_cost = Gauge(
            "livefit_predict_batch_cost_seconds",
            "The fitted batch cost (one batch takes per_row * rows + per_batch seconds)",
            ["model", "term"], registry=r,
        )  # fmt: skip
        self.predict_wait_bound = Gauge(
            "livefit_predict_max_queue_wait_seconds",
            "The expected wait over which requests are refused now (serve.max_queue_wait_ms; "
            "auto: from the model's batch time)",
            ["model"], registry=r,
        )  # fmt: skip
        self.predict_batch_timeout = Gauge(
            "livefit_predict_batch_timeout_seconds",
            "How long a batch may wait for more requests after its oldest arrived: "
            "serve.batch_timeout_ms, or with auto the value chosen for the latest batch",
            ["model"], registry=r,
        )  # fmt: skip
        self.predict_expected_wait = Gauge(
            "livefit_predict_expected_wait_seconds",
            "Expected wait of a one-row request arriving now, before its batch starts "
            "(event-loop lag, running batch, queued batches)",
            ["model"], registry=r,
        )  # fmt: skip
        self.http_connections = Gauge(
            "livefit_http_connections", "Open HTTP connections", registry=r
        )
        self.http_connections_closed = Counter(
            "livefit_http_connections_closed_total",
            "HTTP connections the server closed on its own, by reason: header_timeout (request "
            "head not received in http.header_timeout_s), idle (http.keep_alive_timeout_s), "
            "evicted (to make room under http.max_connections), refused (503: every connection "
            "busy at the cap), header_too_large (http.max_header_bytes), body_timeout (the "
            "body of a request refused from its head did not follow in http.body_timeout_s)",
            ["reason"], registry=r,
        )  # fmt: skip

    def _weight_stream(self, r: CollectorRegistry) -> None:
        """The metrics of weights published and received."""
        self.weights_published = Counter(
            "livefit_weights_published_total",
            "Snapshots published on the weight topic, inline or as a manifest for HTTP pull",
            ["model", "kind"],
            registry=r,
        )
        self.weights_publish_seconds = Histogram(
            "livefit_weights_publish_seconds", "Time to encode and publish one snapshot",
            ["model"], buckets=STEP_BUCKETS, registry=r,
        )  # fmt: skip
        self.weights_payload_bytes = Gauge(
            "livefit_weights_payload_bytes", "Size of the last encoded snapshot", ["model"],
            registry=r,
        )  # fmt: skip
        self.published_version = Gauge(
            "livefit_published_version", "Version of the last snapshot published on MQTT",
            ["model"], registry=r,
        )  # fmt: skip
        self.weights_received = Counter(
            "livefit_weights_received_total",
            "Weight messages received, by outcome (accepted, or why they were refused)",
            ["model", "outcome"],
            registry=r,
        )
        self.weights_age = Gauge(
            "livefit_weights_age_seconds",
            "Now minus the creation time of the snapshot being served",
            ["model"],
            registry=r,
        )
        self.freshness = Histogram(
            "livefit_freshness_seconds",
            "From the newest trained sample's publish time (ts) to its weights being published "
            "(learner) or served (replica)",
            ["model"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )

    def _durability(self, r: CollectorRegistry) -> None:
        """The metrics of the sample log, checkpoints and storage."""
        self.wal_commit_seconds = Histogram(
            "livefit_wal_commit_seconds", "Time to write and fsync one group of accepted messages",
            buckets=STEP_BUCKETS, registry=r,
        )  # fmt: skip
        self.wal_replayed_samples = Counter(
            "livefit_wal_replayed_samples_total",
            "Samples replayed from the write-ahead log at start (accepted before a crash)",
            ["model"],
            registry=r,
        )
        self.checkpoints = Counter(
            "livefit_checkpoints_total", "Checkpoints written, by outcome (ok or failed)",
            ["model", "outcome"], registry=r,
        )  # fmt: skip
        self.checkpoint_seconds = Histogram(
            "livefit_checkpoint_seconds", "Time to write one checkpoint (in the background)",
            ["model"], buckets=STEP_BUCKETS, registry=r,
        )  # fmt: skip
        self.checkpoint_stall_seconds = Histogram(
            "livefit_checkpoint_stall_seconds",
            "Time the trainer paused to copy its state for a checkpoint",
            ["model"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.checkpoint_bytes = Gauge(
            "livefit_checkpoint_bytes", "Size of the last checkpoint file", ["model"], registry=r
        )
        self.model_samples = Gauge(
            "livefit_model_samples",
            "Samples trained into the current weights' lineage (restored from checkpoints)",
            ["model"],
            registry=r,
        )
        self.train_nonfinite = Counter(
            "livefit_train_nonfinite_total",
            "Training steps rolled back because the loss or the updated weights were not finite",
            ["model"],
            registry=r,
        )

    def _labels(self, r: CollectorRegistry) -> None:
        """The metrics of delayed labels (server/labels)."""
        self.labels = Counter(
            "livefit_labels_total",
            "Labels by outcome: joined to their prediction, unknown_id (no prediction came "
            "within the TTL), duplicate, late (after their prediction expired), rejected; and "
            "predictions expired without a label",
            ["model", "outcome"], registry=r,
        )  # fmt: skip
        self.label_delay = Histogram(
            "livefit_label_delay_seconds", "From a prediction being served to its label",
            ["model"], buckets=DELAY_BUCKETS, registry=r,
        )  # fmt: skip
        self.pending_predictions = Gauge(
            "livefit_pending_predictions", "Predictions waiting for their label", ["model"],
            registry=r,
        )  # fmt: skip
        self.pending_labels = Gauge(
            "livefit_pending_labels", "Labels waiting for their prediction record", ["model"],
            registry=r,
        )  # fmt: skip
        self.served_score = Gauge(
            "livefit_served_score",
            "Score of the predictions served, against their labels: accuracy (classifiers) or "
            "mae and mse, over the sliding window or cumulative",
            ["model", "metric", "window"], registry=r,
        )  # fmt: skip
        self.prediction_records = Counter(
            "livefit_prediction_records_total",
            "Prediction records (rows with ids) sent to the learner, or dropped: the buffer "
            "was full or the MQTT client refused them",
            ["model", "outcome"], registry=r,
        )  # fmt: skip

    def _gpu(self, r: CollectorRegistry) -> None:
        """The metrics of GPU memory (exported only where there is a GPU: watch_gpus)."""
        self.gpu_memory = Gauge(
            "livefit_gpu_memory_bytes",
            "GPU memory TensorFlow holds, by device and kind (current or peak); only with a GPU",
            ["device", "kind"],
            registry=r,
        )

    def watch_gpus(self) -> None:
        """Export TensorFlow's memory use of every visible GPU (read at scrape time)."""
        import tensorflow as tf

        def reader(device: str, kind: str) -> Callable[[], float]:
            return lambda: float(tf.config.experimental.get_memory_info(device)[kind])

        for index, _ in enumerate(tf.config.list_physical_devices("GPU")):
            for kind in ("current", "peak"):
                gauge = self.gpu_memory.labels(device=f"GPU:{index}", kind=kind)
                gauge.set_function(reader(f"GPU:{index}", kind))

    def init_model(self, model: str) -> None:
        """Create every per-model series at zero so dashboards and rate() see them at once."""
        for metric in (
            self.ingest_samples, self.queue_depth, self.train_steps, self.train_samples,
            self.train_yield_seconds, self.model_version, self.model_ready,
            self.predict_queue_rows, self.serving_version,
        ):  # fmt: skip
            metric.labels(model=model)
        self.ingest_messages.labels(model=model, outcome="accepted", reason="none")
        self.dead_letters.labels(model=model, outcome="sent")
