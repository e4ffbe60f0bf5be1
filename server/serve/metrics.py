"""Prediction serving's metric families (``base.metrics``: a part claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..base.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, MetricGroup


class ServingMetrics(MetricGroup):
    """Prediction serving: requests, batches, the queue, the version served."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.predict_requests = Counter(
            "livefit_predict_requests_total", "Prediction requests by HTTP status code",
            ["model", "code"], registry=registry,
        )  # fmt: skip
        self.predict_latency = Histogram(
            "livefit_predict_latency_seconds", "Whole prediction request time, parse to response",
            ["model"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.predict_queue_seconds = Histogram(
            "livefit_predict_queue_seconds", "Time a request waited in the batcher's queue",
            ["model"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.predict_batch_size = Histogram(
            "livefit_predict_batch_size", "Rows per model call (before padding)", ["model"],
            buckets=SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.predict_queue_rows = Gauge(
            "livefit_predict_queue_rows", "Rows waiting in the batcher's queue", ["model"],
            registry=registry,
        )  # fmt: skip
        self.serving_version = Gauge(
            "livefit_serving_version", "Version of the weights that answers predictions",
            ["model"], registry=registry,
        )  # fmt: skip

    def init_model(self, model: str) -> None:
        self.predict_queue_rows.labels(model=model)
        self.serving_version.labels(model=model)


class AdmissionMetrics(MetricGroup):
    """Admission: refusals, the batch cost, the wait bound, the batch timeout."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.predict_refused = Counter(
            "livefit_predict_refused_total",
            "Prediction requests refused at admission (429), by reason: wait (expected wait "
            "over serve.max_queue_wait_ms), deadline (would finish after its deadline), rows "
            "(serve.max_queue_rows)",
            ["model", "reason"], registry=registry,
        )  # fmt: skip
        self.predict_batch_cost = Gauge(
            "livefit_predict_batch_cost_seconds",
            "The fitted batch cost (one batch takes per_row * rows + per_batch seconds)",
            ["model", "term"], registry=registry,
        )  # fmt: skip
        self.predict_wait_bound = Gauge(
            "livefit_predict_max_queue_wait_seconds",
            "The expected wait over which requests are refused now (serve.max_queue_wait_ms; "
            "auto: from the model's batch time)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.predict_batch_timeout = Gauge(
            "livefit_predict_batch_timeout_seconds",
            "How long a batch may wait for more requests after its oldest arrived: "
            "serve.batch_timeout_ms, or with auto the value chosen for the latest batch",
            ["model"], registry=registry,
        )  # fmt: skip
        self.predict_expected_wait = Gauge(
            "livefit_predict_expected_wait_seconds",
            "Expected wait of a one-row request arriving now, before its batch starts "
            "(event-loop lag, running batch, queued batches)",
            ["model"], registry=registry,
        )  # fmt: skip


class VersionRecordMetrics(MetricGroup):
    """The serving record: the operator's moves (on the learner) and the record each serving
    process holds (a replica behind the learner shows a lower sequence)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.version_moves = Counter(
            "livefit_version_moves_total",
            "Moves of the serving record made on the learner, by action (label, unlabel, "
            "default, pin, unpin, rollback)",
            ["model", "action"], registry=registry,
        )  # fmt: skip
        self.record_sequence = Gauge(
            "livefit_serving_record_sequence",
            "Sequence of the serving record this process serves by (moves so far; 0: none)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.pinned_version = Gauge(
            "livefit_serving_pinned_version",
            "The version the unversioned path is pinned to (-1: not pinned)",
            ["model"], registry=registry,
        )  # fmt: skip

    def init_model(self, model: str) -> None:
        self.record_sequence.labels(model=model)
        self.pinned_version.labels(model=model).set(-1)

    def held(self, model: str, sequence: int, pinned: int | None) -> None:
        """The record this process now serves by."""
        self.record_sequence.labels(model=model).set(sequence)
        self.pinned_version.labels(model=model).set(-1 if pinned is None else pinned)


class GuardMetrics(MetricGroup):
    """The guard (``serve.guard``): the version it holds, its holds, the scores it compares."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.held_version = Gauge(
            "livefit_guard_held_version",
            "The version the guard holds in serving (-1: it follows the trainer)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.holds = Counter(
            "livefit_guard_holds_total", "Times the guard started holding a version (or moved it)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.newest_loss = Gauge(
            "livefit_guard_newest_loss",
            "The newest version's mean loss as the guard last scored it (on the reference set, "
            "or on the shadow window)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.best_loss = Gauge(
            "livefit_guard_best_loss",
            "The mean loss of the version the guard holds, on the same samples as the newest's",
            ["model"], registry=registry,
        )  # fmt: skip
        self.held_samples = Counter(
            "livefit_guard_held_samples_total",
            "Samples the trainer learned while the guard held an older version in serving: how "
            "much learning a hold kept from the answers",
            ["model"], registry=registry,
        )  # fmt: skip

    def init_model(self, model: str) -> None:
        self.held_version.labels(model=model).set(-1)
        self.holds.labels(model=model)
        self.held_samples.labels(model=model)
