"""The prediction clients against a real uvicorn on a free port, sync and asyncio, both protocols.

The app speaks livefit's codecs (``livefit.server.http.protocol_common``) for a model "double" (outputs are
twice the inputs, version 7) and scripts failures by model name to exercise retries: "flaky" is
busy twice, "busy" once for 0.3 s, "stalled" once for 30 s, "dated" once with an HTTP-date,
"down" and "unhinted" always; "bad" refuses, "slow" misses its deadline.
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from livefit.clients.predict import AsyncPredictClient, PredictClient
from livefit.clients.predict_calls import PredictError, PredictResult
from livefit.server.http.oip import format_oip, oip_model_metadata, parse_oip
from livefit.server.http.protocol_common import ParsedRequest, RequestError
from livefit.server.http.tfserving import format_tfserving, parse_tfserving, tfserving_model_status
from livefit.server.runtime.local_process import free_port

INPUT_SHAPE = (3,)
VERSION = 7
MAX_ROWS = 64
HEALTHY = {"double", "flaky", "busy", "stalled", "dated", "nan"}
Mode = Literal["sync", "async"]
MODES: tuple[Mode, ...] = ("sync", "async")
PROTOCOLS = ("tfserving", "v2")
FAST = {"max_backoff": 0.01}  # keeps backoff without Retry-After short


@dataclass
class Seen:
    """What the app saw, per model name: request headers and arrival times (monotonic)."""

    headers: dict[str, list[dict[str, str]]] = field(default_factory=lambda: defaultdict(list))
    times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ready: bool = True

    def count(self, name: str) -> int:
        return len(self.times[name])

    def record(self, name: str, request: Request) -> int:
        self.headers[name].append(dict(request.headers))
        self.times[name].append(time.monotonic())
        return self.count(name)

    def reset(self) -> None:
        self.headers.clear()
        self.times.clear()
        self.ready = True


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def scripted(name: str, count: int) -> JSONResponse | None:
    """The scripted failure for the ``count``-th request (1 is the first) to ``name``, if any."""
    past = email.utils.format_datetime(datetime.now(UTC) - timedelta(seconds=10), usegmt=True)
    if name == "flaky" and count <= 2:
        return error(429, "queue of model flaky is full", {"Retry-After": "0"})
    if name == "busy" and count == 1:
        return error(429, "queue of model busy is full", {"Retry-After": "0.3"})
    if name == "stalled" and count == 1:
        return error(429, "queue of model stalled is full", {"Retry-After": "30"})
    if name == "dated" and count == 1:
        return error(503, "model dated is not ready yet", {"Retry-After": past})
    if name == "down":
        message = "model down is not ready yet (no weights); retry shortly"
        return error(503, message, {"Retry-After": "0"})
    if name == "unhinted":
        return error(503, "model unhinted is not ready yet")
    if name == "bad":
        return error(400, "inputs[0].data holds strings; send numbers")
    if name == "slow":
        return error(504, "the deadline of 250 ms passed before the batch ran")
    if name not in HEALTHY:
        return error(404, f"unknown model {name!r}; this server has: double")
    return None


def parse(protocol: str, body: bytes) -> ParsedRequest:
    """The request body read by livefit's own codec for ``protocol``."""
    if protocol == "tfserving":
        return parse_tfserving(body, INPUT_SHAPE, MAX_ROWS)
    return parse_oip(body, INPUT_SHAPE, MAX_ROWS)


def answer(protocol: str, parsed: ParsedRequest, outputs: np.ndarray, name: str) -> dict[str, Any]:
    """The response body livefit's own codec writes for ``protocol``."""
    if protocol == "tfserving":
        return format_tfserving(parsed, outputs, VERSION)
    return format_oip(parsed, outputs, name, VERSION)


def first_number_null(body: Any) -> Any:
    """``body`` with its first output value (under ``predictions`` or an output's ``data``)
    written as null."""
    done = False

    def walk(value: Any, key: str = "") -> Any:
        nonlocal done
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, key) for v in value]
        if (
            isinstance(value, int | float)
            and key in ("predictions", "outputs", "data")
            and not done
        ):
            done = True
            return None
        return value

    return walk(body)


def build_app(seen: Seen) -> FastAPI:
    """Both livefit prediction protocols, status routes and readiness, over scripted models."""
    app = FastAPI()

    async def predict(name: str, request: Request, protocol: str) -> JSONResponse:
        failure = scripted(name, seen.record(name, request))
        if failure is not None:
            return failure
        try:
            parsed = parse(protocol, await request.body())
        except RequestError as exc:
            return error(exc.status, exc.message)
        body = answer(protocol, parsed, parsed.rows * 2, name)
        if name == "nan":  # livefit answers 422 instead; other servers write NaN as null
            body = first_number_null(body)
        return JSONResponse(body, headers={"X-Model-Version": str(VERSION)})

    @app.post("/v1/models/{name}:predict")
    async def tfserving_predict(name: str, request: Request) -> JSONResponse:
        return await predict(name, request, "tfserving")

    @app.post("/v2/models/{name}/infer")
    async def oip_infer(name: str, request: Request) -> JSONResponse:
        return await predict(name, request, "v2")

    @app.get("/v1/models/{name}")
    async def tfserving_status(name: str) -> JSONResponse:
        if name == "loading":
            return JSONResponse(tfserving_model_status(None, ready=False))
        return scripted(name, 0) or JSONResponse(tfserving_model_status(VERSION, True))

    @app.get("/v2/models/{name}")
    async def oip_metadata(name: str) -> JSONResponse:
        versions = [] if name == "loading" else [str(VERSION)]
        if name != "loading" and (failure := scripted(name, 0)) is not None:
            return failure
        return JSONResponse(oip_model_metadata(name, versions, INPUT_SHAPE, INPUT_SHAPE))

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": seen.ready}, status_code=200 if seen.ready else 503)

    return app


@dataclass(frozen=True)
class LiveServer:
    url: str
    seen: Seen


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    """The app in uvicorn on a free loopback port, in a thread joined at the end of the module."""
    seen = Seen()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(build_app(seen), log_level="warning", lifespan="off", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-predict-test"
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10.0
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started, "uvicorn did not start in 10 s"
        yield LiveServer(f"http://127.0.0.1:{sock.getsockname()[1]}", seen)
    finally:
        server.should_exit = True
        thread.join(10.0)
        sock.close()
    assert not thread.is_alive(), "uvicorn did not stop in 10 s"


@pytest.fixture
def server(live: LiveServer) -> LiveServer:
    """The module's server with a clean record of what it saw."""
    live.seen.reset()
    return live


def call(mode: Mode, url: str, method: str, *args: Any, **settings: Any) -> Any:
    """``method(*args)`` on a fresh PredictClient or AsyncPredictClient, closed afterwards."""
    if mode == "sync":
        with PredictClient(url, **settings) as client:
            return getattr(client, method)(*args)

    async def run() -> Any:
        async with AsyncPredictClient(url, **settings) as client:
            return await getattr(client, method)(*args)

    return asyncio.run(run())


both_modes = pytest.mark.parametrize("mode", MODES)
both_protocols = pytest.mark.parametrize("protocol", PROTOCOLS)


# --- predictions ----------------------------------------------------------------------------------


@both_modes
@both_protocols
@pytest.mark.parametrize("n", [1, 5])
def test_rows_round_trip_with_version(
    server: LiveServer, mode: Mode, protocol: str, n: int
) -> None:
    rows = np.arange(n * 3, dtype=np.float64).reshape(n, 3) / 7
    result = call(mode, server.url, "predict", "double", rows, protocol=protocol)
    assert isinstance(result, PredictResult)
    assert result.version == VERSION
    assert result.outputs.dtype == np.float32
    assert result.outputs.shape == (n, 3)
    np.testing.assert_array_equal(result.outputs, 2 * rows.astype(np.float32))


@both_modes
@both_protocols
def test_null_outputs_come_back_as_nan(server: LiveServer, mode: Mode, protocol: str) -> None:
    result = call(mode, server.url, "predict", "nan", [[1, 2, 3], [4, 5, 6]], protocol=protocol)
    assert np.isnan(result.outputs[0, 0])
    np.testing.assert_array_equal(result.outputs[1], [8, 10, 12])


@both_modes
def test_deadline_and_user_headers_are_sent(server: LiveServer, mode: Mode) -> None:
    settings = {"deadline_ms": 250, "headers": {"Authorization": "Bearer t0ken"}}
    call(mode, server.url, "predict", "double", [[1, 2, 3]], **settings)
    (headers,) = server.seen.headers["double"]
    assert float(headers["x-deadline-ms"]) == 250.0
    assert headers["authorization"] == "Bearer t0ken"
    assert headers["content-type"] == "application/json"


def test_no_deadline_header_unless_asked(server: LiveServer) -> None:
    call("sync", server.url, "predict", "double", [[1, 2, 3]])
    assert "x-deadline-ms" not in server.seen.headers["double"][0]


# --- retries --------------------------------------------------------------------------------------


@both_modes
@both_protocols
def test_429_with_retry_after_is_retried(server: LiveServer, mode: Mode, protocol: str) -> None:
    result = call(mode, server.url, "predict", "flaky", [[1, 2, 3]], protocol=protocol)
    assert server.seen.count("flaky") == 3
    np.testing.assert_array_equal(result.outputs, [[2, 4, 6]])


@both_modes
def test_retry_after_seconds_are_waited(server: LiveServer, mode: Mode) -> None:
    call(mode, server.url, "predict", "busy", [[1, 2, 3]])
    first, second = server.seen.times["busy"]
    assert second - first >= 0.29  # Retry-After: 0.3 (less a little clock granularity)


@both_modes
def test_retry_after_is_capped_by_max_backoff(server: LiveServer, mode: Mode) -> None:
    call(mode, server.url, "predict", "stalled", [[1, 2, 3]], max_backoff=0.05)
    first, second = server.seen.times["stalled"]
    assert second - first < 5.0  # not the 30 s the server asked for


@both_modes
def test_retry_after_http_date_is_understood(server: LiveServer, mode: Mode) -> None:
    result = call(mode, server.url, "predict", "dated", [[1, 2, 3]])
    assert result.version == VERSION
    assert server.seen.count("dated") == 2


@both_modes
@both_protocols
def test_503_gives_up_after_max_retries(server: LiveServer, mode: Mode, protocol: str) -> None:
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "predict", "down", [[1, 2, 3]], protocol=protocol, max_retries=3)
    assert caught.value.status == 503
    assert caught.value.message == "model down is not ready yet (no weights); retry shortly"
    assert caught.value.retry_after == 0.0
    assert caught.value.attempts == 4
    assert "gave up after 4 attempts" in str(caught.value)
    assert server.seen.count("down") == 4


@both_modes
def test_without_retry_after_backoff_is_used(server: LiveServer, mode: Mode) -> None:
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "predict", "unhinted", [[1, 2, 3]], max_retries=2, **FAST)
    assert caught.value.retry_after is None
    assert server.seen.count("unhinted") == 3


@both_modes
@both_protocols
def test_400_is_not_retried(server: LiveServer, mode: Mode, protocol: str) -> None:
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "predict", "bad", [[1, 2, 3]], protocol=protocol)
    assert (caught.value.status, caught.value.attempts) == (400, 1)
    assert caught.value.message == "inputs[0].data holds strings; send numbers"
    assert server.seen.count("bad") == 1


@both_modes
def test_unknown_model_is_404_with_the_servers_hint(server: LiveServer, mode: Mode) -> None:
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "predict", "nosuch", [[1, 2, 3]])
    assert caught.value.status == 404
    assert "this server has: double" in caught.value.message
    assert server.seen.count("nosuch") == 1


@both_modes
def test_server_side_400_for_wrong_shape(server: LiveServer, mode: Mode) -> None:
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "predict", "double", [[1, 2]])
    assert caught.value.status == 400
    assert "[N, 3]" in caught.value.message


@both_modes
def test_504_is_not_retried_by_default(server: LiveServer, mode: Mode) -> None:
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "predict", "slow", [[1, 2, 3]], deadline_ms=250)
    assert caught.value.status == 504
    assert server.seen.count("slow") == 1


def test_504_is_retried_when_asked(server: LiveServer) -> None:
    settings = {"max_retries": 2, "retry_statuses": {429, 503, 504}, **FAST}
    with pytest.raises(PredictError):
        call("sync", server.url, "predict", "slow", [[1, 2, 3]], **settings)
    assert server.seen.count("slow") == 3


@both_modes
def test_connection_refused_is_retried_then_reported(mode: Mode) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PredictError) as caught:
        call(mode, url, "predict", "double", [[1, 2, 3]], max_retries=2, **FAST)
    assert (caught.value.status, caught.value.attempts) == (0, 3)
    assert "ConnectError" in str(caught.value)
    assert url in str(caught.value)


def v2_answer(request: httpx.Request) -> httpx.Response:
    output = {"name": "output", "shape": [1, 3], "datatype": "FP32", "data": [2, 4, 6]}
    body = {"model_name": "double", "model_version": "7", "outputs": [output]}
    return httpx.Response(200, json=body)


def test_dropped_connections_are_retried() -> None:
    # A real server cannot be made to drop a connection on cue; httpx's mock transport can.
    failures: list[Exception] = [
        httpx.ConnectTimeout("connect timed out"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if failures:
            raise failures.pop(0)
        return v2_answer(request)

    transport = httpx.MockTransport(handler)
    with PredictClient("http://livefit", transport=transport, **FAST) as client:
        assert client.predict("double", [[1, 2, 3]]).version == 7
    assert not failures


def test_read_timeout_is_not_retried() -> None:
    sent: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise httpx.ReadTimeout("timed out", request=request)

    async def run() -> None:
        transport = httpx.MockTransport(handler)
        async with AsyncPredictClient("http://livefit", transport=transport) as client:
            with pytest.raises(PredictError) as caught:
                await client.predict("double", [[1, 2, 3]])
        assert caught.value.status == 0
        assert "ReadTimeout" in str(caught.value)

    asyncio.run(run())
    assert len(sent) == 1


def test_malformed_answer_is_a_predict_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>"))
    client = PredictClient("http://livefit", transport=transport)
    with client, pytest.raises(PredictError, match="not JSON"):
        client.predict("double", [[1, 2, 3]])


def test_wrong_row_count_is_a_predict_error() -> None:
    client = PredictClient("http://livefit", transport=httpx.MockTransport(v2_answer))
    with client, pytest.raises(PredictError, match="1 rows for 2 rows"):
        client.predict("double", [[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("rows", [[], 3.0, [[1.0, float("nan"), 2.0]], [[1e39, 0, 0]]])
def test_unsendable_rows_fail_locally(rows: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing should be sent")

    client = PredictClient("http://livefit", transport=httpx.MockTransport(handler))
    with client, pytest.raises(ValueError, match="rows"):
        client.predict("double", rows)


# --- status ---------------------------------------------------------------------------------------


@both_modes
def test_ready(server: LiveServer, mode: Mode) -> None:
    assert call(mode, server.url, "ready") is True
    server.seen.ready = False
    assert call(mode, server.url, "ready") is False


@both_modes
def test_not_ready_when_unreachable(mode: Mode) -> None:
    assert call(mode, f"http://127.0.0.1:{free_port()}", "ready") is False


@both_modes
@both_protocols
def test_model_version(server: LiveServer, mode: Mode, protocol: str) -> None:
    assert call(mode, server.url, "model_version", "double", protocol=protocol) == VERSION
    assert call(mode, server.url, "model_version", "loading", protocol=protocol) is None
    with pytest.raises(PredictError) as caught:
        call(mode, server.url, "model_version", "nosuch", protocol=protocol)
    assert caught.value.status == 404


# --- pure parts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"protocol": "grpc"},
        {"timeout": 0},
        {"max_retries": -1},
        {"max_backoff": -1.0},
        {"deadline_ms": 0},
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(settings))):
        PredictClient("http://livefit", **settings)
