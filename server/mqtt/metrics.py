"""The MQTT client's metric families (``base.metrics``: a part claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..base.metrics import MetricGroup


class BrokerMetrics(MetricGroup):
    """The MQTT connection of a process's client."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.broker_connected = Gauge(
            "livefit_broker_connected", "1 while connected to the MQTT broker", registry=registry
        )
        self.broker_connects = Counter(
            "livefit_broker_connects_total",
            "Successful MQTT connections (the first one and every reconnect)",
            registry=registry,
        )
        self.broker_disconnects = Counter(
            "livefit_broker_disconnects_total", "Unexpected MQTT disconnections", registry=registry
        )
        self.broker_failovers = Counter(
            "livefit_broker_failovers_total",
            "Switches to the next node of broker.url after a lost connection or a failed attempt",
            registry=registry,
        )
        self.broker_node_connections = Gauge(
            "livefit_broker_node_connections",
            "MQTT sample sessions connected to this broker node (host:port) now",
            ["node"],
            registry=registry,
        )


class PublishRefusedMetrics(MetricGroup):
    """Publishes that never reached a subscriber (every MQTT client of a process)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.broker_publish_refused = Counter(
            "livefit_broker_publish_refused_total",
            "Messages the broker refused (MQTT 5 PUBACK reason >= 0x80, e.g. an ACL) or that were "
            "not sent because their PUBLISH is over the broker's maximum packet size",
            ["topic", "reason"],
            registry=registry,
        )
