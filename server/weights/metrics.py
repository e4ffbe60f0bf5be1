"""The weight stream's metric families (``base.metrics``: a part claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..base.metrics import STEP_BUCKETS, MetricGroup


class WeightsPublishedMetrics(MetricGroup):
    """The weights this process publishes (the learner's)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.weights_published = Counter(
            "livefit_weights_published_total",
            "Snapshots published on the weight topic, inline or as a manifest for HTTP pull",
            ["model", "kind"],
            registry=registry,
        )
        self.weights_publish_failed = Counter(
            "livefit_weights_publish_failed_total",
            "Snapshots not published: even their manifest's PUBLISH is over the broker's maximum "
            "packet size (replicas get no weights; the refusal is also in "
            "livefit_broker_publish_refused_total)",
            ["model"],
            registry=registry,
        )
        self.weights_publish_seconds = Histogram(
            "livefit_weights_publish_seconds", "Time to encode and publish one snapshot",
            ["model"], buckets=STEP_BUCKETS, registry=registry,
        )  # fmt: skip
        self.weights_payload_bytes = Gauge(
            "livefit_weights_payload_bytes", "Size of the last encoded snapshot", ["model"],
            registry=registry,
        )  # fmt: skip
        self.published_version = Gauge(
            "livefit_published_version", "Version of the last snapshot published on MQTT",
            ["model"], registry=registry,
        )  # fmt: skip
        self.weights_foreign = Counter(
            "livefit_weights_foreign_total",
            "Messages on the learner's own weight topic that are not its own (another key or "
            "lineage, unsigned, or the retained message deleted); its snapshot is put back",
            ["model"],
            registry=registry,
        )


class WeightsReceivedMetrics(MetricGroup):
    """The weights this process receives and serves (a replica's)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.weights_received = Counter(
            "livefit_weights_received_total",
            "Weight messages received, by outcome (accepted, or why they were refused)",
            ["model", "outcome"],
            registry=registry,
        )
        self.weights_age = Gauge(
            "livefit_weights_age_seconds",
            "Now minus the creation time of the snapshot being served",
            ["model"],
            registry=registry,
        )


class FreshnessMetrics(MetricGroup):
    """How old the newest trained sample is when its weights are published (``stage``
    "published", by the process that trains) or served (``stage`` "served", by a replica or a
    split learner's serving process): one group's ``/metrics`` carries both, apart."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.freshness = Histogram(
            "livefit_freshness_seconds",
            "From the newest trained sample's publish time (ts) to its weights being published "
            "(stage=published: the training side) or served (stage=served: a replica or a split "
            "learner's serving process)",
            ["model", "stage"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
            registry=registry,
        )
