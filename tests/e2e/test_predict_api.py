"""The prediction API through a real uvicorn: both protocols, tritonclient, every error code.

A real learner runtime (real broker, real Keras models) is served in-process on a free port.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from livefit.server.config.settings import load_settings
from livefit.server.http.app import create_app
from livefit.server.runtime.learner import LearnerRuntime
from livefit.server.runtime.mosquitto import Mosquitto
from tests.inprocess import InProcessServer
from tests.linear import linear_forward

CONFIG = """
[broker]
url = "{url}"
client_id = "predict-api-{port}"
[storage]
dir = "{storage}"
[models.demo]
builder = "linear"
input_shape = [4]
output_shape = [2]
seed = 3
[models.demo.serve]
max_batch_size = 32
batch_timeout_ms = 1
max_request_rows = 16
max_request_bytes = 2048
[models.half]
builder = "linear"
input_shape = [1]
output_shape = [1]
seed = 4
"""


@pytest.fixture(scope="module")
def server(
    broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessServer]:
    workdir = tmp_path_factory.mktemp("predict-api")
    path = workdir / "livefit.toml"
    path.write_text(CONFIG.format(url=broker.url, port=broker.port, storage=workdir / "data"))
    runtime = LearnerRuntime(load_settings(path, environ={}))
    instance = InProcessServer(create_app(runtime)).start()
    yield instance
    instance.stop()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """The module-scoped server's threads outlive single tests by design."""
    yield


def expected(server: InProcessServer, model: str, rows: np.ndarray) -> np.ndarray:
    """What the served weights compute for a linear model: rows @ kernel + bias."""
    runtime = server.server.config.app.state.runtime
    return linear_forward(runtime.models[model].slot.latest.weights, rows)


def post(server: InProcessServer, path: str, body: object, **kwargs: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, timeout=10, **kwargs)  # type: ignore[arg-type]


def test_health_and_metadata(server: InProcessServer) -> None:
    assert httpx.get(f"{server.url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    metadata = httpx.get(f"{server.url}/v2").json()
    assert metadata["name"] == "livefit"
    # what works is listed (it said "extensions": [] though tritonclient's binary data worked)
    assert metadata["extensions"] == ["binary_tensor_data", "model_configuration"]
    assert httpx.get(f"{server.url}/v2/models/demo/ready").json() == {"name": "demo", "ready": True}
    meta = httpx.get(f"{server.url}/v2/models/demo").json()
    assert meta["inputs"][0]["shape"] == [-1, 4] and meta["outputs"][0]["shape"] == [-1, 2]
    status = httpx.get(f"{server.url}/v1/models/demo").json()
    assert status["model_version_status"][0]["state"] == "AVAILABLE"


def test_tfserving_row_and_column_formats(server: InProcessServer) -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    row = post(server, "/v1/models/demo:predict", {"instances": rows.tolist()})
    assert row.status_code == 200, row.text
    body = row.json()
    np.testing.assert_allclose(body["predictions"], expected(server, "demo", rows), rtol=1e-5)
    assert body["model_version"] == row.headers["x-model-version"]
    column = post(server, "/v1/models/demo:predict", {"inputs": rows.tolist()})
    np.testing.assert_allclose(column.json()["outputs"], body["predictions"], rtol=1e-6)


def test_tfserving_spec_example(server: InProcessServer) -> None:
    response = post(server, "/v1/models/half:predict", {"instances": [1.0, 2.0, 5.0]})
    assert response.status_code == 200, response.text
    rows = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)
    np.testing.assert_allclose(
        response.json()["predictions"], expected(server, "half", rows), rtol=1e-5
    )


def test_oip_json_and_spec_example(server: InProcessServer) -> None:
    body = {
        "id": "42",
        "inputs": [
            {
                "name": "input",  # the model's input name (metadata and config say so)
                "shape": [2, 4],
                "datatype": "UINT32",
                "data": [1, 2, 3, 4, 5, 6, 7, 8],
            }
        ],
        "outputs": [{"name": "output"}],
    }
    response = post(server, "/v2/models/demo/infer", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["id"] == "42" and answer["model_name"] == "demo"
    assert int(answer["model_version"]) >= 0
    out = answer["outputs"][0]
    assert out["shape"] == [2, 2] and out["datatype"] == "FP32"
    rows = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(
        np.reshape(out["data"], (2, 2)), expected(server, "demo", rows), rtol=1e-5
    )


def test_tritonclient_reads_the_model_config_and_wrong_input_names_fail(
    server: InProcessServer,
) -> None:
    """``get_model_config`` (404 before) answers as Triton does; an input with another name
    than the config's is refused (400, naming the expected one) instead of served."""
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    try:
        config = client.get_model_config("demo")
        assert config == {
            "name": "demo",
            "platform": "livefit-keras",
            "backend": "livefit",
            "max_batch_size": 16,
            "input": [
                {"name": "input", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4]}
            ],
            "output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [2]}],
        }
        (spec,) = config["input"]
        rows = np.ones((2, 4), dtype=np.float32)
        tensor = triton.InferInput("input0", [2, *spec["dims"]], "FP32")
        tensor.set_data_from_numpy(rows)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("demo", [tensor])
        assert caught.value.status() == "400"
        assert 'unknown input "input0"; the model has one input, "input"' in str(caught.value)
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_model_config("nope")
    finally:
        client.close()


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_unchanged(server: InProcessServer, binary: bool) -> None:
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    try:
        assert client.is_server_live() and client.is_model_ready("demo")
        rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
        tensor = triton.InferInput("input", [5, 4], "FP32")
        tensor.set_data_from_numpy(rows, binary_data=binary)
        result = client.infer(
            "demo", [tensor], outputs=[triton.InferRequestedOutput("output", binary_data=binary)]
        )
        np.testing.assert_allclose(
            result.as_numpy("output"), expected(server, "demo", rows), rtol=1e-5
        )
    finally:
        client.close()


ERRORS = [
    ("/v1/models/demo:predict", {"instances": [[1, 2, 3]]}, 400, "shape"),
    ("/v1/models/demo:predict", b"{not json", 400, "JSON"),
    ("/v1/models/demo:predict", {"rows": [[1, 2, 3, 4]]}, 400, "instances"),
    ("/v1/models/demo:predict", b'{"instances": [[1, 2, NaN, 4]]}', 400, "finite"),
    ("/v1/models/demo:predict", {"instances": [["a", "b", "c", "d"]]}, 400, ""),
    ("/v2/models/demo/infer", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "BYTES", "data": ["a"] * 4}]}, 400, "BYTES"),
    ("/v2/models/demo/infer", {"inputs": [{"name": "x", "shape": [1, 4], "data": [1, 2, 3, 4]}]}, 400, "datatype"),
    ("/v2/models/demo/infer", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2]}]}, 400, ""),
    ("/v1/models/nope:predict", {"instances": [[1, 2, 3, 4]]}, 404, "unknown model"),
    ("/v2/models/nope/infer", {"inputs": []}, 404, "demo"),
    ("/v1/models/demo:predict", {"instances": [[1, 2, 3, 4]] * 17}, 413, "16"),
    ("/v1/models/demo:predict", {"instances": [[1.123456789] * 4] * 15, "pad": "x" * 2048}, 413, "max_request_bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "hint"), ERRORS)
def test_errors_are_json_with_a_hint(
    server: InProcessServer, path: str, body: object, status: int, hint: str
) -> None:
    response = post(server, path, body)
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str) and hint in message


def test_deadline_passes_gives_504(server: InProcessServer) -> None:
    response = post(
        server,
        "/v1/models/demo:predict",
        {"instances": [[1, 2, 3, 4]]},
        headers={"X-Deadline-Ms": "0.001"},
    )
    assert response.status_code == 504 and "deadline" in response.json()["error"]
    bad = post(
        server,
        "/v1/models/demo:predict",
        {"instances": [[1, 2, 3, 4]]},
        headers={"X-Deadline-Ms": "soon"},
    )
    assert bad.status_code == 400


def test_unknown_route_and_method_are_json(server: InProcessServer) -> None:
    assert httpx.get(f"{server.url}/nowhere").json() == {"error": "Not Found"}
    assert httpx.get(f"{server.url}/v2/models/demo/infer").status_code == 405


def test_request_metrics(server: InProcessServer) -> None:
    post(server, "/v1/models/demo:predict", {"instances": [[1, 2, 3, 4]]})
    text = httpx.get(f"{server.url}/metrics").text
    assert 'livefit_predict_requests_total{code="200",model="demo"}' in text
    assert 'livefit_predict_requests_total{code="400",model="demo"}' in text
    assert (
        "livefit_predict_batch_size_bucket" in text
        and "livefit_predict_queue_seconds_count" in text
    )
    assert 'livefit_serving_version{model="demo"}' in text


def test_the_dashboard_tells_a_clients_errors_from_the_servers(server: InProcessServer) -> None:
    """The dashboard counted a client's own 400 as a "prediction error" (issue 45): malformed
    requests are the client's errors, apart from refusals and the server's errors."""

    def stats() -> dict[str, float]:
        return httpx.get(f"{server.url}/api/stats", timeout=10).json()["models"]["demo"]

    before = stats()
    assert post(server, "/v1/models/demo:predict", b"{not json").status_code == 400
    assert post(server, "/v1/models/demo:predict", {"instances": [[1, 2]]}).status_code == 400
    assert post(server, "/v1/models/demo:predict", {"instances": [[1, 2, 3, 4]]}).status_code == 200
    after = stats()
    assert after["predict_client_errors_total"] == before["predict_client_errors_total"] + 2
    assert after["predict_server_errors_total"] == before["predict_server_errors_total"] == 0
    assert after["predict_refused_total"] == before["predict_refused_total"]
    assert after["predict_requests_total"] == before["predict_requests_total"] + 3


def test_requests_for_no_model_share_one_series(server: InProcessServer) -> None:
    for name in ("ghost-1", "ghost-2", "ghost-3"):
        assert post(server, f"/v1/models/{name}:predict", {"instances": [[1]]}).status_code == 404
    text = httpx.get(f"{server.url}/metrics").text
    assert 'livefit_predict_requests_total{code="404",model="unknown"}' in text
    assert "ghost" not in text  # a client cannot create series at will


def test_predictions_are_served_by_plain_routes_and_documented() -> None:
    """The fast Starlette routes come first; the FastAPI ones stay in the OpenAPI document."""
    from fastapi.routing import APIRoute
    from prometheus_client import CollectorRegistry
    from starlette.routing import Match

    from livefit.server.base.metrics import Metrics
    from livefit.server.http.predict_api import build_predict_router

    router = build_predict_router(lambda: {}, Metrics(CollectorRegistry()))
    for path in ("/v1/models/m:predict", "/v2/models/m/infer"):
        scope = {"type": "http", "path": path, "method": "POST"}
        first = next(r for r in router.routes if r.matches(scope)[0] is Match.FULL)
        assert not isinstance(first, APIRoute), path
    documented = {r.path for r in router.routes if isinstance(r, APIRoute)}
    assert {"/v1/models/{name}:predict", "/v2/models/{name}/infer"} <= documented
