"""429 and 503 through a real uvicorn, made deterministic with a serving model we can hold.

The runtime here is a small stand-in (no broker, no trainer): a real ServingModel on a real
Keras model, whose snapshot source and model calls the test controls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from livefit.models import build_model
from livefit.server.app import create_app
from livefit.server.config import ModelSettings
from livefit.server.metrics import Metrics
from livefit.server.serving import ServedModel, ServingModel
from livefit.server.snapshot import Snapshot, SnapshotSlot
from tests.inprocess import InProcessServer


class HeldServingModel(ServingModel):
    """A serving model whose calls wait until the test opens ``gate``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def predict(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        self.entered.set()
        self.gate.wait(30)
        return super().predict(rows)


class StubRuntime:
    """One served model, no training: the app's Runtime protocol and nothing more."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.settings = ModelSettings.model_validate(
            {"builder": "linear", "input_shape": [2], "output_shape": [1],
             "serve": {"max_batch_size": 2, "batch_timeout_ms": 0, "max_queue_rows": 4}}
        )  # fmt: skip
        self.slot = SnapshotSlot()
        model = build_model("linear", [2], [1], seed=0)
        self.weights = tuple(np.asarray(w) for w in model.get_weights())
        self.serving = HeldServingModel(
            "m", model, [2], self.settings.serve.batch_sizes(), lambda: self.slot.latest, "/CPU:0"
        )
        self._served = {"m": ServedModel("m", self.settings, self.serving)}

    def start(self) -> None:
        self.serving.warm_up()

    def stop(self) -> None:
        pass

    def ready(self) -> bool:
        return self.slot.latest is not None

    def served(self) -> dict[str, ServedModel]:
        return self._served

    def weight_store(self, name: str) -> None:
        return None

    def publish(self, version: int) -> None:
        self.slot.publish(Snapshot("m", version, self.weights, time.time(), 0))
        self._served["m"].snapshot_arrived()


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
