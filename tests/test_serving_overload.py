"""429 and 503 through a real uvicorn, made deterministic with a serving model we can hold.

The runtime here is a small stand-in (no broker, no trainer): a real ServingModel on a real
Keras model, whose snapshot source and model calls the test controls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from livefit.server.app import create_app
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime


@pytest.fixture
def stub() -> Iterator[tuple[StubRuntime, InProcessServer]]:
    runtime = StubRuntime()
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


def test_full_queue_answers_429_with_retry_after(stub: tuple[StubRuntime, InProcessServer]) -> None:
    runtime, server = stub
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
    while runtime.served()["m"].batcher.queued_rows < 4 and time.monotonic() < deadline:  # type: ignore[union-attr]
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
