"""429 and 503 through a real uvicorn, made deterministic with a serving model we can hold.

The runtime here is a small stand-in (no broker, no trainer): a real ServingModel on a real
Keras model, whose snapshot source and model calls the test controls.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from livefit.server.http.app import create_app
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime


@pytest.fixture
def stub() -> Iterator[tuple[StubRuntime, InProcessServer]]:
    runtime = StubRuntime()
    server = InProcessServer(create_app(runtime)).start()
    yield runtime, server
    runtime.serving.gate.set()
    server.stop()


def serve_settings(runtime: StubRuntime, **serve: object) -> None:
    """Change the stub model's serve settings (before its batcher starts with the server)."""
    endpoint = runtime.endpoints()["m"]
    endpoint.settings = endpoint.settings.model_copy(
        update={"serve": endpoint.settings.serve.model_copy(update=serve)}
    )


@pytest.fixture
def stub_with(request: pytest.FixtureRequest) -> Iterator[tuple[StubRuntime, InProcessServer]]:
    runtime = StubRuntime()
    serve_settings(runtime, **request.param)
    server = InProcessServer(create_app(runtime)).start()
    yield runtime, server
    runtime.serving.gate.set()
    server.stop()


def predict(server: InProcessServer, rows: int = 2) -> httpx.Response:
    body = {"instances": [[0.5, 0.5]] * rows}
    return httpx.post(f"{server.url}/v1/models/m:predict", json=body, timeout=30)


def test_not_ready_until_weights_arrive(stub: tuple[StubRuntime, InProcessServer]) -> None:
    runtime, server = stub
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503
    assert httpx.get(f"{server.url}/v2/models/m/ready").status_code == 503
    response = predict(server)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert "not ready" in response.json()["error"]
    assert (
        httpx.get(f"{server.url}/v1/models/m").json()["model_version_status"][0]["state"]
        == "LOADING"
    )
    runtime.publish(5)
    ok = predict(server)
    assert ok.status_code == 200 and ok.json()["model_version"] == "5"


@pytest.mark.parametrize("stub_with", [{"max_queue_wait_ms": 60_000}], indirect=True)
def test_full_queue_answers_429_with_retry_after(
    stub_with: tuple[StubRuntime, InProcessServer],
) -> None:
    """The row bound (a memory bound), alone: the wait bound is set out of the way."""
    runtime, server = stub_with
    runtime.publish(1)
    runtime.serving.gate.clear()  # the model is busy: requests pile up in the queue
    results: list[httpx.Response] = []

    def client() -> None:
        results.append(predict(server))

    busy = threading.Thread(target=client)
    busy.start()
    assert runtime.serving.entered.wait(10)  # the first batch is in the model
    queued = [threading.Thread(target=client) for _ in range(2)]  # 2 x 2 rows = max_queue_rows
    for thread in queued:
        thread.start()
    deadline = time.monotonic() + 10
    while runtime.endpoints()["m"].batcher.queued_rows < 4 and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    rejected = predict(server)
    assert rejected.status_code == 429
    assert int(rejected.headers["retry-after"]) >= 1
    assert "max_queue_rows" in rejected.json()["error"]
    runtime.serving.gate.set()
    for thread in [busy, *queued]:
        thread.join(30)
    assert [r.status_code for r in results] == [200, 200, 200]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'livefit_predict_requests_total{code="429",model="m"} 1.0' in metrics


@pytest.mark.parametrize("stub_with", [{"max_queue_wait_ms": 100}], indirect=True)
def test_429_comes_before_the_body_when_the_expected_wait_is_too_long(
    stub_with: tuple[StubRuntime, InProcessServer],
) -> None:
    """The model is stuck on a batch (far past its predicted time) with one request queued
    behind it: the queue holds only 2 of its 4 rows, but the expected wait is over
    max_queue_wait_ms, so a new request is refused at once, before its body is read. It was
    admitted and its body awaited (here: never sent, so the client heard nothing until the
    body timeout)."""
    runtime, server = stub_with
    runtime.publish(1)
    assert predict(server).status_code == 200  # a first batch: the cost model has a figure
    runtime.serving.gate.clear()
    runtime.serving.entered.clear()
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(predict(server)))]
    threads[0].start()
    assert runtime.serving.entered.wait(10)
    threads.append(threading.Thread(target=lambda: results.append(predict(server))))
    threads[1].start()
    deadline = time.monotonic() + 10
    while runtime.endpoints()["m"].batcher.queued_rows < 2 and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    time.sleep(0.3)  # the stuck batch is now far past its predicted time
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n"
        )  # the head only: the body never comes
        answer = sock.recv(65536)
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 429"), answer[:300]
    assert b"retry-after: " in head
    runtime.serving.gate.set()
    for thread in threads:
        thread.join(30)
    assert sorted(r.status_code for r in results) == [200, 200]
