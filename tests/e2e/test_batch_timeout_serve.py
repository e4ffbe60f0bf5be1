"""``serve.batch_timeout_ms = "auto"`` in a real ``livefit serve``: it predicts with it and
exports the timeout it chose (0 for one client at a time), a fixed model its setting. The
controller and the batcher alone: ``tests/unit/serve/test_batch_cost.py``, ``test_batcher.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto

CONFIG = """
[broker]
url = "{url}"
client_id = "auto-timeout-{port}"
[storage]
dir = "{storage}"
[models.demo]
builder = "linear"
input_shape = [4]
output_shape = [1]
seed = 3
[models.demo.serve]
batch_timeout_ms = "auto"
max_batch_timeout_ms = 4
[models.fixed]
builder = "linear"
input_shape = [4]
output_shape = [1]
seed = 3
[models.fixed.serve]
batch_timeout_ms = 3
"""


@pytest.fixture
def server(broker: Mosquitto, tmp_path: Path) -> Iterator[LivefitProcess]:
    config = CONFIG.format(url=broker.url, port=broker.port, storage=tmp_path / "data")
    process = LivefitProcess(config, tmp_path).start()
    yield process
    assert process.stop() == 0


def test_livefit_serve_with_auto_predicts_and_exports_the_timeout(server: LivefitProcess) -> None:
    body = {"instances": [[0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0]]}
    answers = {}
    for model in ("demo", "fixed"):
        for _ in range(20):
            response = httpx.post(f"{server.url}/v1/models/{model}:predict", json=body, timeout=10)
            assert response.status_code == 200, response.text
        answers[model] = response.json()["predictions"]
    assert answers["demo"] == answers["fixed"]  # same seed, same numbers, whatever the timeout
    # one client at a time: auto chooses 0; the fixed model exports its setting
    assert server.metric("livefit_predict_batch_timeout_seconds", model="demo") == 0.0
    assert server.metric("livefit_predict_batch_timeout_seconds", model="fixed") == 0.003
