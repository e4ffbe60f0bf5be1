"""Reading one figure from ``/metrics`` (``clients.metrics``): what a script reads from a group or a
lone process, checked against a real merged exposition (``merge_expositions`` of real
registries, as a group's ``/metrics`` answers it) served by a real HTTP server on loopback."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from livefit.clients.metrics import MetricsReader, tls_context
from livefit.server.base.metrics_merge import merge_expositions


def _process(trained: float | None, version: float | None, requests: float | None) -> bytes:
    """One process's exposition: the families it owns, as livefit's processes export them."""
    registry = CollectorRegistry()
    if trained is not None:
        Counter("livefit_train_samples", "", ["model"], registry=registry).labels("m").inc(trained)
    if version is not None:
        Gauge("livefit_serving_version", "", ["model"], registry=registry).labels("m").set(version)
    if requests is not None:
        counter = Counter("livefit_predict_requests", "", ["model"], registry=registry)
        counter.labels("m").inc(requests)
    return generate_latest(registry)


@pytest.fixture
def serve_text() -> Iterator[Callable[[bytes], str]]:
    """A loopback HTTP server answering ``/metrics`` with the text last given; yields a setter
    that takes the text and returns the server's base URL."""
    body = [b""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/metrics"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body[0] if found else b'{"error":"Not Found"}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def set_text(text: bytes) -> str:
        body[0] = text
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield set_text
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_reader_reads_one_figure_from_a_group_or_a_lone_process(
    serve_text: Callable[[bytes], str],
) -> None:
    group = merge_expositions([
        ("training", _process(trained=700, version=None, requests=None)),
        ("0", _process(trained=None, version=5, requests=30)),
        ("1", _process(trained=None, version=4, requests=12)),
    ])  # fmt: skip
    reader = MetricsReader(serve_text(group))
    assert reader.value("livefit_train_samples_total", model="m") == 700  # training's
    assert reader.value("livefit_predict_requests_total", model="m") == 42  # summed
    assert reader.value("livefit_serving_version", model="m") == 4  # what every one serves
    assert reader.value("livefit_serving_version", model="m", worker="0") == 5  # exact labels
    assert reader.value("livefit_serving_version", model="other") == 0.0
    assert reader.value("livefit_absent_total", model="m") == 0.0
    lone = MetricsReader(serve_text(_process(trained=9, version=3, requests=2)))
    assert lone.value("livefit_train_samples_total", model="m") == 9
    assert lone.value("livefit_serving_version", model="m") == 3
    assert lone.samples()[("livefit_predict_requests_total", (("model", "m"),))] == 2


def test_the_reader_takes_the_metrics_address_and_refuses_an_error_page(
    serve_text: Callable[[bytes], str],
) -> None:
    base = serve_text(_process(trained=9, version=None, requests=None))
    assert MetricsReader(base + "/metrics/").value("livefit_train_samples_total", model="m") == 9
    with pytest.raises(httpx.HTTPStatusError):  # livefit's 404 JSON is not metrics text
        MetricsReader(base + "/v1").value("livefit_train_samples_total", model="m")


def test_scrapes_share_one_tls_context(
    serve_text: Callable[[bytes], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polling loops scrape many times a second: each scrape made a TLS context of its own (the
    CA bundle loaded again, 20 ms of CPU) until readers shared one."""
    made: list[object] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    tls_context.cache_clear()
    base = serve_text(_process(trained=9, version=None, requests=None))
    for _ in range(3):
        assert MetricsReader(base).value("livefit_train_samples_total", model="m") == 9
    assert len(made) == 1
