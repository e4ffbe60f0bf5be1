"""Versioned predictions through real processes: a split ``livefit serve`` (its training and
serving processes) on a real mosquitto, asked over HTTP and with tritonclient's
``model_version=``.

1. samples, then the version served once they are trained (V1): its predictions; a graceful
   stop, whose final checkpoint holds V1 with the weights it served (the weight average, by
   default, where it predicts better than the trained weights).
2. a restart on the same storage; more samples (V2), more again (V3), each recorded when
   current. ``versions.keep_snapshots = 1``: only the newest snapshot is kept in memory.
3. V1, now a checkpoint read from disk by the serving process of another learner process,
   answers exactly what it answered when it was current; V3 (current) too, by number; V2 has
   expired: a 404 naming the kept versions, over both protocols and tritonclient.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.storage.checkpoint import checkpoint_versions
from tests.configs import learner_config, model
from tests.e2e.test_average_restart import publish
from tests.e2e.test_reliability import wait_trained
from tests.layouts import SPLIT, metric

ROWS = np.random.default_rng(4).normal(size=(3, 8)).astype(np.float32)
CHUNK = 400  # samples a round


def config(broker: Mosquitto, storage: Path) -> str:
    demo = model(
        lines="learning_rate = 0.05\nseed = 3", train="max_batch_size = 16",
        checkpoint="interval_s = 3600", versions="keep_snapshots = 1",
    )  # fmt: skip
    return learner_config(broker, storage, f"versions-{broker.port}", demo, layout=SPLIT)


def predict(url: str, path: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"instances": ROWS.tolist()}, timeout=30)


def current(server: LivefitProcess, samples: int) -> tuple[int, list[list[float]]]:
    """Once ``samples`` are trained and their last version is served: that version and its
    predictions of ``ROWS``."""
    wait_trained(server, samples)
    trained = int(metric(server, "livefit_model_version", model="demo"))
    answer = predict(server.url, "/v1/models/demo:predict")
    for _ in range(100):  # the serving process swaps the last version in within a moment
        if int(answer.json()["model_version"]) == trained:
            break
        answer = predict(server.url, "/v1/models/demo:predict")
    body = answer.json()
    assert int(body["model_version"]) == trained, body
    return trained, body["predictions"]


def test_versions_answer_as_when_current_and_expired_ones_are_404(
    broker: Mosquitto, tmp_path: Path
) -> None:
    storage = tmp_path / "data"
    text = config(broker, storage)
    server = LivefitProcess(text, tmp_path).start()
    try:
        publish(broker, CHUNK, "round-1", seed=1)
        v1, when_current_1 = current(server, CHUNK)
    finally:
        server.stop()
    assert v1 in checkpoint_versions(storage / "checkpoints" / "demo")  # the stop's checkpoint
    server = LivefitProcess(text, tmp_path).start()
    try:
        publish(broker, CHUNK, "round-2", seed=2)
        v2, when_current_2 = current(server, 2 * CHUNK)
        publish(broker, CHUNK, "round-3", seed=3)
        v3, when_current_3 = current(server, 3 * CHUNK)
        assert v1 < v2 < v3 and when_current_1 != when_current_2 != when_current_3
        for version, expected in ((v1, when_current_1), (v3, when_current_3)):
            answer = predict(server.url, f"/v1/models/demo/versions/{version}:predict")
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"predictions": expected, "model_version": str(version)}
        kept = f"kept: {v3} (recent snapshots); {v1} (checkpoints)"
        for path in (f"/v1/models/demo/versions/{v2}:predict", f"/v2/models/demo/versions/{v2}"):
            gone = predict(server.url, path) if path.endswith("predict") else httpx.get(
                f"{server.url}{path}", timeout=30
            )  # fmt: skip
            assert gone.status_code == 404
            assert gone.json()["error"].endswith(kept), gone.text
        check_tritonclient(server.url, (v1, when_current_1), v2, (v3, when_current_3))
    finally:
        server.stop()


def check_tritonclient(
    url: str,
    first: tuple[int, list[list[float]]],
    expired: int,
    newest: tuple[int, list[list[float]]],
) -> None:
    """tritonclient's ``model_version=`` reaches the versioned OIP paths."""
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        tensor = triton.InferInput("input", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS, binary_data=True)
        for version, expected in (first, newest):
            result = client.infer("demo", [tensor], model_version=str(version))
            assert result.get_response()["model_version"] == str(version)
            np.testing.assert_array_equal(result.as_numpy("output"), np.float32(expected))
            assert client.is_model_ready("demo", model_version=str(version))
        metadata = client.get_model_metadata("demo", model_version=str(first[0]))
        assert metadata["versions"] == [str(newest[0]), str(first[0])]
        assert not client.is_model_ready("demo", model_version=str(expired))
        with pytest.raises(InferenceServerException, match=f"version {expired} of model demo"):
            client.infer("demo", [tensor], model_version=str(expired))
    finally:
        client.close()
