"""No response mixes weight versions: many clients predict while the trainer publishes snapshots.

Every snapshot the trainer hands over is recorded. Each response's numbers must equal what the
version it names computes for its input (for a linear model: x @ kernel + bias), exactly up to
float32 rounding. A torn read or a batch spanning two versions would break that.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import numpy as np

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.server.config.settings import load_settings
from livefit.server.http.app import create_app
from livefit.server.runtime.learner import LearnerRuntime
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.wire.snapshot import Snapshot
from tests.inprocess import InProcessServer
from tests.linear import linear_forward

CONFIG = """
[broker]
url = "{url}"
client_id = "consistency-{port}"
[storage]
dir = "{storage}"
[models.lin]
builder = "linear"
input_shape = [6]
output_shape = [3]
learning_rate = 0.01
seed = 5
[models.lin.train]
max_batch_size = 32
[models.lin.weights]
publish_interval_s = 0.02
[models.lin.serve]
# This test checks versions, not admission: no request may be refused as overloaded.
max_queue_wait_ms = 60000
max_batch_size = 16
batch_timeout_ms = 2
"""


def publish_stream(broker: Mosquitto, stop: threading.Event) -> None:
    stream = LinearStream(input_dim=6, output_dim=3, seed=1)
    with SamplePublisher(broker.url, "livefit/lin/samples", fmt="msgpack", raw=True) as publisher:
        while not stop.is_set():
            x, y = stream.sample(8)
            publisher.publish(x, y, batched=True)
            stop.wait(0.002)


async def hammer(url: str, max_seconds: float) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Predict from 16 clients until 400 answers spanning 10 versions are in (or time is up)."""
    results: list[tuple[np.ndarray, np.ndarray, int]] = []
    versions: set[int] = set()
    rng = np.random.default_rng(0)

    async def client(http: httpx.AsyncClient) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + max_seconds
        while loop.time() < end and (len(results) < 400 or len(versions) < 10):
            rows = rng.normal(size=(int(rng.integers(1, 4)), 6)).astype(np.float32)
            response = await http.post("/v1/models/lin:predict", json={"instances": rows.tolist()})
            assert response.status_code == 200, response.text
            body = response.json()
            results.append((rows, np.asarray(body["predictions"]), int(body["model_version"])))
            versions.add(int(body["model_version"]))

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        await asyncio.gather(*(client(http) for _ in range(16)))
    return results


def test_every_response_matches_its_version(broker: Mosquitto, tmp_path: Path) -> None:
    path = tmp_path / "livefit.toml"
    path.write_text(CONFIG.format(url=broker.url, port=broker.port, storage=tmp_path / "data"))
    runtime = LearnerRuntime(load_settings(path, environ={}))
    snapshots: dict[int, Snapshot] = {}
    server = InProcessServer(create_app(runtime)).start()
    runtime.models["lin"].slot.subscribe(lambda s: snapshots.__setitem__(s.version, s))
    first = runtime.models["lin"].slot.latest
    assert first is not None
    snapshots[first.version] = first
    stop = threading.Event()
    publisher = threading.Thread(target=publish_stream, args=(broker, stop))
    publisher.start()
    try:
        results = asyncio.run(hammer(server.url, max_seconds=60.0))
    finally:
        stop.set()
        publisher.join(30)
        server.stop()
    versions = {version for _, _, version in results}
    assert len(results) >= 400 and len(versions) >= 10, (len(results), len(versions))
    for rows, outputs, version in results:
        np.testing.assert_allclose(
            outputs, linear_forward(snapshots[version].weights, rows), rtol=1e-5, atol=1e-5
        )
