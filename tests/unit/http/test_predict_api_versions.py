"""The versioned paths through a real uvicorn (``predict_api``, ``model_lookup``): TF Serving's
``/v1/models/{name}/versions/{N}:predict`` and status, OIP's ``/v2/models/{name}/versions/{N}``
infer, metadata, ready and config; a version not kept is a 404 naming the kept ones, what is no
version number a 400; the answers name the version that computed them."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from livefit.server.http.app import create_app
from livefit.server.serve.endpoint import ModelEndpoint
from livefit.server.serve.versions import KeptVersions
from livefit.server.wire.snapshot import Snapshot
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime

ROWS = [[1.0, 2.0], [0.5, -1.0]]


class VersionedRuntime(StubRuntime):
    """The stub runtime whose endpoint keeps past versions (3 snapshots), each version's
    weights its own: version v adds v to every weight."""

    def __init__(self) -> None:
        super().__init__()
        settings = self.model_settings.model_copy(
            update={"versions": self.model_settings.versions.model_copy(
                update={"keep_snapshots": 3})}
        )  # fmt: skip
        versions = KeptVersions("m", settings.versions, self.serving.source)
        self.slot.subscribe(versions.add)
        self._endpoints = {"m": ModelEndpoint("m", settings, self.serving, versions)}

    def publish(self, version: int) -> None:
        weights = tuple(w + np.float32(version) for w in self.weights)
        self.slot.publish(Snapshot("m", version, weights, time.time(), 0))
        self._endpoints["m"].snapshot_arrived()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, VersionedRuntime]]:
    runtime = VersionedRuntime()
    server = InProcessServer(create_app(runtime)).start()
    try:
        yield server.url, runtime
    finally:
        server.stop()


def predict(url: str, path: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"instances": ROWS}, timeout=10)


def infer(url: str, path: str) -> httpx.Response:
    body = {"inputs": [{"name": "input", "shape": [2, 2], "datatype": "FP32",
                        "data": [v for row in ROWS for v in row]}]}  # fmt: skip
    return httpx.post(f"{url}{path}", json=body, timeout=10)


def test_a_version_answers_what_it_answered_when_current(
    served: tuple[str, VersionedRuntime],
) -> None:
    url, runtime = served
    when_current = {}
    for version in (1, 2, 3, 4):
        runtime.publish(version)
        answer = predict(url, "/v1/models/m:predict")
        assert answer.json()["model_version"] == str(version)
        when_current[version] = answer.json()["predictions"]
    assert len({str(p) for p in when_current.values()}) == 4  # the versions differ
    for version in (2, 4, 3):
        tf = predict(url, f"/v1/models/m/versions/{version}:predict")
        assert tf.status_code == 200, tf.text
        assert tf.json() == {"predictions": when_current[version], "model_version": str(version)}
        assert tf.headers["x-model-version"] == str(version)
        v2 = infer(url, f"/v2/models/m/versions/{version}/infer")
        assert v2.status_code == 200, v2.text
        assert v2.json()["model_version"] == str(version)
        flat = [v for row in when_current[version] for v in row]
        assert v2.json()["outputs"][0]["data"] == flat
    assert predict(url, "/v1/models/m:predict").json()["model_version"] == "4"


def test_a_version_not_kept_is_a_404_naming_the_kept_ones(
    served: tuple[str, VersionedRuntime],
) -> None:
    url, runtime = served
    for version in (10, 11, 12, 13):
        runtime.publish(version)
    message = (
        "version 10 of model m is not kept (expired, or never made); kept: 11-13 (recent snapshots)"
    )
    for answer in (
        predict(url, "/v1/models/m/versions/10:predict"),
        infer(url, "/v2/models/m/versions/10/infer"),
        httpx.get(f"{url}/v1/models/m/versions/10"),
        httpx.get(f"{url}/v2/models/m/versions/10"),
        httpx.get(f"{url}/v2/models/m/versions/10/ready"),
        httpx.get(f"{url}/v2/models/m/versions/10/config"),
    ):
        assert (answer.status_code, answer.json()) == (404, {"error": message})
    unknown = predict(url, "/v1/models/nope/versions/11:predict")
    assert unknown.status_code == 404 and "unknown model 'nope'" in unknown.text


@pytest.mark.parametrize("version", ["-1", "1.0", "x", "٣", "1" * 19, "%201"])
def test_what_is_no_version_number_is_a_400(
    served: tuple[str, VersionedRuntime], version: str
) -> None:
    url, runtime = served
    runtime.publish(20)
    answer = predict(url, f"/v1/models/m/versions/{version}:predict")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith("a version is a whole number of at most 18 digits")


def test_status_metadata_ready_and_config_name_the_kept_versions(
    served: tuple[str, VersionedRuntime],
) -> None:
    url, runtime = served
    for version in (30, 31, 32):
        runtime.publish(version)
    status = httpx.get(f"{url}/v1/models/m").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [
        ("32", "AVAILABLE"), ("31", "AVAILABLE"), ("30", "AVAILABLE")
    ]  # fmt: skip
    one = httpx.get(f"{url}/v1/models/m/versions/31").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in one] == [("31", "AVAILABLE")]
    assert httpx.get(f"{url}/v2/models/m").json()["versions"] == ["32", "31", "30"]
    metadata = httpx.get(f"{url}/v2/models/m/versions/30")
    assert metadata.status_code == 200 and metadata.json()["versions"] == ["32", "31", "30"]
    ready = httpx.get(f"{url}/v2/models/m/versions/30/ready")
    assert (ready.status_code, ready.json()) == (200, {"name": "m", "version": "30", "ready": True})
    config = httpx.get(f"{url}/v2/models/m/versions/31/config")
    assert config.status_code == 200 and config.json()["name"] == "m"
    wrong_method = httpx.get(f"{url}/v1/models/m/versions/31:predict")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
