"""The live dashboard's ``/api/stats``, read from a real registry.

The router is served with a real uvicorn in this process, and every stats value is checked
against hand-computed numbers (quantiles interpolated inside histogram buckets, nulls for
absent series, no NaN). The page in a real browser: ``tests/e2e/test_dashboard_browser.py``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from livefit.server.base.metrics import Metrics
from livefit.server.http.dashboard import build_dashboard_router
from livefit.server.http.dashboard_page import render_page
from livefit.server.http.dashboard_stats import collect_stats
from livefit.server.ingest.metrics import SampleQueueMetrics
from livefit.server.serve.metrics import ServingMetrics
from livefit.server.train.metrics import TrainingMetrics, TrainingStateMetrics
from livefit.server.weights.metrics import FreshnessMetrics, WeightsReceivedMetrics
from tests.inprocess import InProcessServer
from tests.metric_groups import every_family


def reject_constant(name: str) -> float:
    raise ValueError(f"JSON carries {name}, which is not JSON")


def fill_metrics() -> Metrics:
    """ "demo" with hand-picked values, "idle" at zero, "healthy" with no error, no "ghost"."""
    metrics = every_family()  # a one-process learner's parts, and a replica's
    metrics.init_model("demo")
    metrics.init_model("idle")
    metrics.group(ServingMetrics).predict_requests.labels(model="healthy", code="200").inc(5)
    metrics.group(ServingMetrics).predict_latency.labels(
        model="idle"
    )  # a histogram with no observation yet
    metrics.group(TrainingMetrics).train_samples.labels(model="demo").inc(150)
    metrics.group(TrainingMetrics).train_steps.labels(model="demo").inc(3)
    metrics.group(SampleQueueMetrics).queue_depth.labels(model="demo").set(7)
    metrics.group(TrainingMetrics).train_loss.labels(model="demo").set(0.25)
    metrics.group(TrainingMetrics).prequential_loss.labels(model="demo").set(math.nan)
    metrics.group(TrainingStateMetrics).model_version.labels(model="demo").set(3)
    metrics.group(ServingMetrics).serving_version.labels(model="demo").set(2)
    metrics.group(WeightsReceivedMetrics).weights_age.labels(model="demo").set(1.5)
    metrics.group(ServingMetrics).predict_requests.labels(model="demo", code="200").inc(8)
    metrics.group(ServingMetrics).predict_requests.labels(model="demo", code="429").inc(2)
    metrics.group(ServingMetrics).predict_requests.labels(model="demo", code="400").inc(3)
    metrics.group(ServingMetrics).predict_requests.labels(model="demo", code="413").inc(1)
    metrics.group(ServingMetrics).predict_requests.labels(model="demo", code="503").inc(1)
    metrics.group(ServingMetrics).predict_requests.labels(model="demo", code="500").inc(1)
    for seconds in [0.003] * 4 + [0.007] * 4 + [0.02] * 2:
        metrics.group(ServingMetrics).predict_latency.labels(model="demo").observe(seconds)
    for rows in (4, 12):
        metrics.group(ServingMetrics).predict_batch_size.labels(model="demo").observe(rows)
    for expert, share in (("network", 0.75), ("linear_expert", 0.25)):
        metrics.group(TrainingMetrics).expert_weight.labels(model="demo", expert=expert).set(share)
    for seconds in (0.3, 100.0, 100.0):  # the median lies beyond the last finite bucket (60 s)
        metrics.group(FreshnessMetrics).freshness.labels(model="demo", stage="published").observe(
            seconds
        )
    return metrics


def test_a_group_shows_freshness_to_served_not_mixed_with_published() -> None:
    """A split learner's /metrics has the training process's freshness to published and the
    serving processes' to served; the dashboard shows served (what predictions get)."""
    metrics = every_family()
    for seconds in (0.02, 0.02, 0.02):
        metrics.group(FreshnessMetrics).freshness.labels(model="demo", stage="published").observe(
            seconds
        )
    for seconds in (4.0, 4.0):
        metrics.group(FreshnessMetrics).freshness.labels(model="demo", stage="served").observe(
            seconds
        )
    stats = collect_stats(metrics.registry.collect(), ["demo"], "learner")["models"]["demo"]
    assert 2.0 < stats["freshness_p50"] <= 5.0  # the served buckets alone (mixed: 0.025)


@pytest.fixture
def stats_server() -> Iterator[InProcessServer]:
    app = FastAPI()
    app.include_router(build_dashboard_router(fill_metrics(), lambda: ["demo", "idle", "healthy", "ghost"], "learner"))  # fmt: skip
    server = InProcessServer(app).start()
    try:
        yield server
    finally:
        server.stop()


def test_stats_are_read_from_the_registry(stats_server: InProcessServer) -> None:
    response = httpx.get(f"{stats_server.url}/api/stats", timeout=10)
    assert response.status_code == 200
    data = json.loads(response.text, parse_constant=reject_constant)
    assert data["role"] == "learner"
    assert abs(data["time"] - time.time()) < 60
    demo = data["models"]["demo"]
    assert demo["predict_latency"]["p50"] == pytest.approx(0.005 + 0.005 * (5 - 4) / (8 - 4))
    assert demo["predict_latency"]["p99"] == pytest.approx(0.01 + 0.015 * (9.9 - 8) / (10 - 8))
    assert demo == {
        "train_samples_total": 150.0, "train_steps_total": 3.0, "queue_depth": 7.0,
        "train_loss": 0.25, "prequential_loss": None, "prequential_accuracy": None,
        "model_version": 3.0, "serving_version": 2.0, "weights_age_seconds": 1.5,
        "predict_requests_total": 16.0, "predict_client_errors_total": 4.0,
        "predict_refused_total": 3.0, "predict_server_errors_total": 1.0,
        "predict_latency": demo["predict_latency"], "predict_batch_mean": 8.0,
        "freshness_p50": 60.0, "expert_weight_network": 0.75,
        "expert_weight_linear_expert": 0.25,
    }  # fmt: skip
    idle = data["models"]["idle"]
    assert idle["train_samples_total"] == 0.0 and idle["model_version"] == 0.0
    assert idle["predict_latency"] == {"p50": None, "p99": None}
    for key in ("train_loss", "predict_requests_total", "predict_client_errors_total",
                "predict_refused_total", "predict_server_errors_total",
                "predict_batch_mean", "freshness_p50", "weights_age_seconds"):  # fmt: skip
        assert idle[key] is None, key
    healthy = data["models"]["healthy"]
    assert healthy["predict_client_errors_total"] == healthy["predict_server_errors_total"] == 0.0
    ghost = data["models"]["ghost"]
    assert ghost["predict_latency"] == {"p50": None, "p99": None}
    assert {v for k, v in ghost.items() if k != "predict_latency"} == {None}


def test_page_is_self_contained(stats_server: InProcessServer) -> None:
    response = httpx.get(f"{stats_server.url}/", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    page = response.text
    assert "<title>livefit &ndash; learner</title>" in page
    assert not re.search(r"https?://", page), "the page must not reference other hosts"
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)
    assert not re.search(r"<link[^>]*href=\"(?!data:)", page), "only data: links"
    assert "@import" not in page and "url(" not in page
    assert "<title>livefit &ndash; replica</title>" in render_page("replica")
    assert "&lt;b&gt;" in render_page("<b>")


# -- The page in a real browser ----------------------------------------------------------------
