"""The metric families of prediction serving, declared on ``Metrics`` (which inherits
``ServingMetrics``): requests and batches, admission, HTTP connections, the weight stream
(published and received), the learner's label joiner and a serving process's prediction
records.

This module owns those families and the latency and label-delay buckets (``LATENCY_BUCKETS``,
``DELAY_BUCKETS``). Each method ``_<group>`` creates the families of one group
(``metrics.GROUPS``) on no registry; ``Metrics.export`` puts a group on the process's registry
when a part that updates it claims it.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from .metrics_learning import SIZE_BUCKETS, STEP_BUCKETS

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
DELAY_BUCKETS = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 604800.0,
)  # fmt: skip


class ServingMetrics:
    """The serving, weight stream and label metrics of ``Metrics``."""

    def _serving(self) -> None:
        """The metrics of prediction serving: requests, batches, the queue, the version served."""
        self.predict_requests = Counter(
            "livefit_predict_requests_total", "Prediction requests by HTTP status code",
            ["model", "code"], registry=None,
        )  # fmt: skip
        self.predict_latency = Histogram(
            "livefit_predict_latency_seconds", "Whole prediction request time, parse to response",
            ["model"], buckets=LATENCY_BUCKETS, registry=None,
        )  # fmt: skip
        self.predict_queue_seconds = Histogram(
            "livefit_predict_queue_seconds", "Time a request waited in the batcher's queue",
            ["model"], buckets=LATENCY_BUCKETS, registry=None,
        )  # fmt: skip
        self.predict_batch_size = Histogram(
            "livefit_predict_batch_size", "Rows per model call (before padding)", ["model"],
            buckets=SIZE_BUCKETS, registry=None,
        )  # fmt: skip
        self.predict_queue_rows = Gauge(
            "livefit_predict_queue_rows", "Rows waiting in the batcher's queue", ["model"],
            registry=None,
        )  # fmt: skip
        self.serving_version = Gauge(
            "livefit_serving_version", "Version of the weights that answers predictions",
            ["model"], registry=None,
        )  # fmt: skip

    def _admission(self) -> None:
        """The metrics of admission: refusals, the batch cost, the wait bound, timeouts."""
        self.predict_refused = Counter(
            "livefit_predict_refused_total",
            "Prediction requests refused at admission (429), by reason: wait (expected wait "
            "over serve.max_queue_wait_ms), deadline (would finish after its deadline), rows "
            "(serve.max_queue_rows)",
            ["model", "reason"], registry=None,
        )  # fmt: skip
        self.predict_batch_cost = Gauge(
            "livefit_predict_batch_cost_seconds",
            "The fitted batch cost (one batch takes per_row * rows + per_batch seconds)",
            ["model", "term"], registry=None,
        )  # fmt: skip
        self.predict_wait_bound = Gauge(
            "livefit_predict_max_queue_wait_seconds",
            "The expected wait over which requests are refused now (serve.max_queue_wait_ms; "
            "auto: from the model's batch time)",
            ["model"], registry=None,
        )  # fmt: skip
        self.predict_batch_timeout = Gauge(
            "livefit_predict_batch_timeout_seconds",
            "How long a batch may wait for more requests after its oldest arrived: "
            "serve.batch_timeout_ms, or with auto the value chosen for the latest batch",
            ["model"], registry=None,
        )  # fmt: skip
        self.predict_expected_wait = Gauge(
            "livefit_predict_expected_wait_seconds",
            "Expected wait of a one-row request arriving now, before its batch starts "
            "(event-loop lag, running batch, queued batches)",
            ["model"], registry=None,
        )  # fmt: skip

    def _http(self) -> None:
        """The metrics of HTTP connections."""
        self.http_connections = Gauge(
            "livefit_http_connections", "Open HTTP connections", registry=None
        )
        self.http_connections_closed = Counter(
            "livefit_http_connections_closed_total",
            "HTTP connections the server closed on its own, by reason: header_timeout (request "
            "head not received in http.header_timeout_s), idle (http.keep_alive_timeout_s), "
            "evicted (to make room under http.max_connections), refused (503: every connection "
            "busy at the cap), header_too_large (http.max_header_bytes), body_timeout (the "
            "body of a request refused from its head did not follow in http.body_timeout_s)",
            ["reason"], registry=None,
        )  # fmt: skip

    def _weights_published(self) -> None:
        """The metrics of the weights this process publishes (the learner's)."""
        self.weights_published = Counter(
            "livefit_weights_published_total",
            "Snapshots published on the weight topic, inline or as a manifest for HTTP pull",
            ["model", "kind"],
            registry=None,
        )
        self.weights_publish_seconds = Histogram(
            "livefit_weights_publish_seconds", "Time to encode and publish one snapshot",
            ["model"], buckets=STEP_BUCKETS, registry=None,
        )  # fmt: skip
        self.weights_payload_bytes = Gauge(
            "livefit_weights_payload_bytes", "Size of the last encoded snapshot", ["model"],
            registry=None,
        )  # fmt: skip
        self.published_version = Gauge(
            "livefit_published_version", "Version of the last snapshot published on MQTT",
            ["model"], registry=None,
        )  # fmt: skip
        self.weights_foreign = Counter(
            "livefit_weights_foreign_total",
            "Messages on the learner's own weight topic that are not its own (another key or "
            "lineage, unsigned, or the retained message deleted); its snapshot is put back",
            ["model"],
            registry=None,
        )

    def _weights_received(self) -> None:
        """The metrics of the weights this process receives and serves (a replica's)."""
        self.weights_received = Counter(
            "livefit_weights_received_total",
            "Weight messages received, by outcome (accepted, or why they were refused)",
            ["model", "outcome"],
            registry=None,
        )
        self.weights_age = Gauge(
            "livefit_weights_age_seconds",
            "Now minus the creation time of the snapshot being served",
            ["model"],
            registry=None,
        )

    def _freshness(self) -> None:
        """How old the newest trained sample is when its weights are published (``stage``
        "published", by the process that trains) or served (``stage`` "served", by a replica or
        a split learner's serving process): one group's ``/metrics`` carries both, apart."""
        self.freshness = Histogram(
            "livefit_freshness_seconds",
            "From the newest trained sample's publish time (ts) to its weights being published "
            "(stage=published: the training side) or served (stage=served: a replica or a split "
            "learner's serving process)",
            ["model", "stage"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
            registry=None,
        )

    def _labels(self) -> None:
        """The metrics of the learner's label joiner (server/labels): labels, delays, scores."""
        self.labels = Counter(
            "livefit_labels_total",
            "Labels by outcome: joined to their prediction, unknown_id (no prediction came "
            "within the TTL), duplicate, late (after their prediction expired), rejected; and "
            "predictions expired without a label",
            ["model", "outcome"], registry=None,
        )  # fmt: skip
        self.label_delay = Histogram(
            "livefit_label_delay_seconds", "From a prediction being served to its label",
            ["model"], buckets=DELAY_BUCKETS, registry=None,
        )  # fmt: skip
        self.pending_predictions = Gauge(
            "livefit_pending_predictions", "Predictions waiting for their label", ["model"],
            registry=None,
        )  # fmt: skip
        self.pending_labels = Gauge(
            "livefit_pending_labels", "Labels waiting for their prediction record", ["model"],
            registry=None,
        )  # fmt: skip
        self.served_score = Gauge(
            "livefit_served_score",
            "Score of the predictions served, against their labels: accuracy (classifiers) or "
            "mae and mse, over the sliding window or cumulative",
            ["model", "metric", "window"], registry=None,
        )  # fmt: skip

    def _prediction_records(self) -> None:
        """The metrics of prediction records a serving process sends to the learner."""
        self.prediction_records = Counter(
            "livefit_prediction_records_total",
            "Prediction records (rows with ids) sent to the learner, or dropped: the buffer "
            "was full or the MQTT client refused them",
            ["model", "outcome"], registry=None,
        )  # fmt: skip
