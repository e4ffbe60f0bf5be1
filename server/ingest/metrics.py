"""The metric families of ingestion and the training queue (``base.metrics``: a part claims
its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..base.metrics import MetricGroup


class IngestMetrics(MetricGroup):
    """MQTT ingestion: messages, samples, rejections reported on the dead-letter topic."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.ingest_messages = Counter(
            "livefit_ingest_messages_total",
            "MQTT sample messages by outcome (accepted or rejected) and rejection reason",
            ["model", "outcome", "reason"],
            registry=registry,
        )
        self.ingest_samples = Counter(
            "livefit_ingest_samples_total", "Samples accepted into the training queue",
            ["model"], registry=registry,
        )  # fmt: skip
        self.dead_letters = Counter(
            "livefit_dead_letter_publishes_total",
            "Rejected messages reported on the dead-letter topic, by outcome (sent or failed)",
            ["model", "outcome"],
            registry=registry,
        )

    def init_model(self, model: str) -> None:
        self.ingest_samples.labels(model=model)
        self.ingest_messages.labels(model=model, outcome="accepted", reason="none")
        self.dead_letters.labels(model=model, outcome="sent")


class IngestSequenceMetrics(MetricGroup):
    """Numbered messages: duplicates, gaps, missing, stalls, silence."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.ingest_duplicates = Counter(
            "livefit_ingest_duplicates_total",
            "Messages dropped because their (source, seq) was already accepted (dedup on)",
            ["model"],
            registry=registry,
        )
        self.ingest_sequence_restarts = Counter(
            "livefit_ingest_sequence_restarts_total",
            "Publishers seen numbering from the start again under one source: evidence epoch "
            "(a new run's epoch: its messages count anew) or seq (no epoch: a seq back at the "
            "source's first or far below its newest; with dedup its messages are dropped as "
            "duplicates)",
            ["model", "evidence"],
            registry=registry,
        )
        self.ingest_seq_gaps = Counter(
            "livefit_ingest_seq_gaps_total",
            "Numbered messages given up on as never received (a gap older than the out-of-order "
            "window), with or without dedup",
            ["model"],
            registry=registry,
        )
        self.ingest_seq_missing = Gauge(
            "livefit_ingest_seq_missing",
            "Numbered messages missing now: below the newest (source, seq) received and not "
            "received (yet); a late message fills its place",
            ["model"],
            registry=registry,
        )
        self.ingest_stalled = Gauge(
            "livefit_ingest_stalled",
            "1 while messages wait longer than ingest_stall_after_s with no message finished",
            ["model"],
            registry=registry,
        )
        self.ingest_seconds_since_message = Gauge(
            "livefit_ingest_seconds_since_message",
            "Seconds since a message last arrived on the model's samples topic (since its "
            "subscription when none has; 0 before the first connection)",
            ["model"],
            registry=registry,
        )


class SampleQueueMetrics(MetricGroup):
    """The training queue between the ingest worker and a trainer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.queue_depth = Gauge(
            "livefit_queue_depth", "Samples waiting for the trainer", ["model"], registry=registry
        )

    def init_model(self, model: str) -> None:
        self.queue_depth.labels(model=model)
