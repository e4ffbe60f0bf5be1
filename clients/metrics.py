"""Read a livefit server's ``/metrics`` into numbers, for scripts, tests and benchmarks.

from livefit.clients.metrics import MetricsReader
reader = MetricsReader("http://127.0.0.1:8000")
trained = reader.value("livefit_train_samples_total", model="demo")
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted label pairs)


class MetricsReader:
    """Scrapes one server's Prometheus text exposition (a fresh scrape on every call)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.timeout_s = timeout_s

    def samples(self) -> dict[SampleKey, float]:
        """Every sample as ``{(name, sorted labels): value}``; raises httpx errors."""
        text = httpx.get(self.url, timeout=self.timeout_s).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return values

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (exactly these labels); 0.0 when the server has not got it."""
        return self.samples().get((name, tuple(sorted(labels.items()))), 0.0)
