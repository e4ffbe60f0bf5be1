"""Read a livefit server's ``/metrics`` into numbers, for scripts, tests and benchmarks.

from livefit.clients.metrics import MetricsReader
reader = MetricsReader("http://127.0.0.1:8000")
trained = reader.value("livefit_train_samples_total", model="demo")
"""

from __future__ import annotations

import functools
import ssl

import httpx
from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted label pairs)


GROUP_LABEL = (
    "worker"  # a group's processes label their series with it (server/base/metrics_merge.py)
)
SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class MetricsReader:
    """Scrapes one server's Prometheus text exposition (a fresh scrape on every call).

    A server is one process or a group (a split learner, a replica with ``--workers N``) whose
    ``/metrics`` labels each process's series ``worker="<i>"`` (``"training"`` for a split
    learner's training process). ``value`` reads one figure for the whole server either way.
    """

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        """``base_url``: the server (``http://host:port``), or its ``/metrics`` address."""
        base = base_url.rstrip("/")
        self.url = base if base.endswith("/metrics") else base + "/metrics"
        self.timeout_s = timeout_s

    def samples(self) -> dict[SampleKey, float]:
        """Every sample as ``{(name, sorted labels): value}``; raises httpx errors (an answer
        other than 200 too)."""
        return {key: value for key, (value, _) in self._scrape().items()}

    def value(self, name: str, **labels: str) -> float:
        """One figure for the server: the sample with exactly ``labels``; else, on a group,
        the samples with ``labels`` and a ``worker`` label: summed for counters and histograms
        (requests, samples trained), and for a gauge the training process's if it has one
        (model version), else the lowest over the serving processes (the version every one
        of them serves, whether all are ready). 0.0 when the server has none of them: not yet,
        or, on a group, while the process that exports them restarts (its series are missing
        from the scrape then, and ``livefit_workers_unreachable`` counts it)."""
        scraped = self._scrape()
        exact = scraped.get((name, tuple(sorted(labels.items()))))
        if exact is not None:
            return exact[0]
        found: dict[str, tuple[float, str]] = {}
        for (sample, pairs), value_and_type in scraped.items():
            if sample != name:
                continue
            rest = dict(pairs)
            worker = rest.pop(GROUP_LABEL, None)
            if worker is not None and rest == labels:
                found[worker] = value_and_type
        if not found:
            return 0.0
        if next(iter(found.values()))[1] in SUMMED_TYPES:
            return sum(value for value, _ in found.values())
        if "training" in found:
            return found["training"][0]
        return min(value for value, _ in found.values())

    def _scrape(self) -> dict[SampleKey, tuple[float, str]]:
        """Every sample as ``{(name, sorted labels): (value, its family's type)}``; an answer
        other than 200 raises ``httpx.HTTPStatusError``."""
        response = httpx.get(self.url, timeout=self.timeout_s, verify=tls_context())
        response.raise_for_status()
        text = response.text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                values[key] = (sample.value, family.type)
        return values


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, made once: made per request (loading the CA bundle) it cost
    20 ms of CPU a scrape, 5x the parse of a learner's /metrics, in loops that poll."""
    return httpx.create_ssl_context()
