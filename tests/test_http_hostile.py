"""Hostile and broken HTTP input against a real uvicorn: tokens, slow and oversized bodies,
malformed JSON. Never a 5xx, never a hang, limits enforced, secrets never echoed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from livefit.server.app import create_app
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime

TOKEN = "s3cret-token-value"


@pytest.fixture
def guarded() -> Iterator[InProcessServer]:
    runtime = StubRuntime(http={"token": TOKEN, "protect_predictions": True, "body_timeout_s": 0.5})
    server = InProcessServer(create_app(runtime)).start()
    runtime.publish(1)
    yield server
    server.stop()


def predict(
    server: InProcessServer, headers: dict[str, str] | None = None, body: bytes | None = None
) -> httpx.Response:
    content = body if body is not None else b'{"instances": [[0.5, 0.5]]}'
    return httpx.post(
        f"{server.url}/v1/models/m:predict", content=content, headers=headers, timeout=10
    )


def test_token_guards_predictions_and_weights(guarded: InProcessServer) -> None:
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = predict(guarded, headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in response.text
    ok = predict(guarded, {"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert httpx.get(f"{guarded.url}/v2/models/m").status_code == 401
    assert httpx.get(f"{guarded.url}/v1/models/m/weights").status_code == 401
    assert httpx.get(f"{guarded.url}/v2/health/live").status_code == 200  # probes stay open
    assert httpx.get(f"{guarded.url}/metrics").status_code == 200


def test_slow_body_gets_408_and_the_server_keeps_serving(guarded: InProcessServer) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"instances": '
        )
        started = time.monotonic()
        answer = sock.recv(4096).decode(errors="replace")
        assert time.monotonic() - started < 5
    assert answer.startswith("HTTP/1.1 408") and "not received within" in answer
    assert predict(guarded, {"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"", 400),
        (b"null", 400),
        (b"[]", 400),
        (b'{"instances": ', 400),
        (b"\xff\xfe\x00garbage", 400),
        (b'{"instances": [[1, 2]], "inputs": [[1, 2]]}', 400),
        (b'{"instances": "' + b"a" * 9_000_000 + b'"}', 413),
        (b'{"instances": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 400),
    ],
)
def test_broken_bodies_get_4xx(guarded: InProcessServer, body: bytes, status: int) -> None:
    response = predict(guarded, {"Authorization": f"Bearer {TOKEN}"}, body)
    assert response.status_code == status, response.text[:200]
    assert "error" in response.json()
