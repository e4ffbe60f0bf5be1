"""The delayed labels' metric families (``base.metrics``: a part claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..base.metrics import DELAY_BUCKETS, MetricGroup


class LabelMetrics(MetricGroup):
    """The learner's label joiner: labels, their delays, what waits, served scores."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.labels = Counter(
            "livefit_labels_total",
            "Labels by outcome: joined to their prediction, unknown_id (no prediction came "
            "within the TTL), duplicate, late (after their prediction expired), rejected; and "
            "predictions expired without a label",
            ["model", "outcome"], registry=registry,
        )  # fmt: skip
        self.label_delay = Histogram(
            "livefit_label_delay_seconds", "From a prediction being served to its label",
            ["model"], buckets=DELAY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.pending_predictions = Gauge(
            "livefit_pending_predictions", "Predictions waiting for their label", ["model"],
            registry=registry,
        )  # fmt: skip
        self.pending_labels = Gauge(
            "livefit_pending_labels", "Labels waiting for their prediction record", ["model"],
            registry=registry,
        )  # fmt: skip
        self.prediction_rows_rejected = Counter(
            "livefit_prediction_rows_rejected_total",
            "Rows of prediction-record messages the learner left out while taking the rest of "
            "their message: non_finite (NaN or infinity in the row's inputs or outputs)",
            ["model", "reason"], registry=registry,
        )  # fmt: skip
        self.served_score = Gauge(
            "livefit_served_score",
            "Score of the predictions served, against their labels: accuracy (classifiers) or "
            "mae and mse, over the sliding window or cumulative",
            ["model", "metric", "window"], registry=registry,
        )  # fmt: skip


class PredictionRecordMetrics(MetricGroup):
    """Prediction records a serving process sends to the learner."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.prediction_records = Counter(
            "livefit_prediction_records_total",
            "Prediction records (rows with ids) sent to the learner, or dropped: the buffer "
            "was full or the MQTT client refused them; refused by the broker; non_finite: "
            "not sent, an input or output was NaN or infinity",
            ["model", "outcome"], registry=registry,
        )  # fmt: skip
