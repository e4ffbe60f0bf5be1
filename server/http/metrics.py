"""The HTTP server's metric families (``base.metrics``: a part claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..base.metrics import MetricGroup


class HttpMetrics(MetricGroup):
    """HTTP connections: open, and closed by the server on its own."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.http_connections = Gauge(
            "livefit_http_connections", "Open HTTP connections", registry=registry
        )
        self.http_connections_closed = Counter(
            "livefit_http_connections_closed_total",
            "HTTP connections the server closed on its own, by reason: header_timeout (request "
            "head not received in http.header_timeout_s), idle (http.keep_alive_timeout_s), "
            "evicted (to make room under http.max_connections), refused (503: every connection "
            "busy at the cap), header_too_large (http.max_header_bytes), body_timeout (the "
            "body of a request refused from its head did not follow in http.body_timeout_s)",
            ["reason"], registry=registry,
        )  # fmt: skip
