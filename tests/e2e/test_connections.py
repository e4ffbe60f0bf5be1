"""Slow, idle and too many connections against the real ``run_server`` (uvicorn with livefit's
connection settings) on 127.0.0.1, with real sockets.

uvicorn closes a keep-alive connection only after a response: a client that connects and sends
nothing, or sends its request head one line at a time, was never closed, and every such client
held a file descriptor. These tests check that the request head has a time limit, idle
connections are closed, the number of connections is capped (so descriptors are bounded) and
well-behaved clients are still served while hundreds of slow ones are connected. Waits are
bounded by the configured timeouts plus a margin; nothing asserts how fast the server is.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from livefit.clients.metrics import MetricsReader
from livefit.server.runtime.local_process import free_port

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
PARTIAL_HEAD = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}  # the capped server wants it; others ignore it
BODY = b'{"instances": [[0.5, 0.5]]}'


class Server:
    """``tests.connection_server`` in a child process: the stub runtime behind run_server."""

    def __init__(self, http: dict[str, object], serve: dict[str, object] | None = None) -> None:
        self.port = free_port()
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        argv = [sys.executable, "-m", "tests.connection_server", str(self.port), json.dumps(http)]
        self.process = subprocess.Popen(
            [*argv, json.dumps(serve or {})],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            if self.process.poll() is not None:
                out = (
                    self.process.stdout.read().decode(errors="replace")
                    if self.process.stdout
                    else ""
                )
                raise RuntimeError(f"server exited early:\n{out[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def metric(self, name: str, **labels: str) -> float:
        return MetricsReader(self.url).value(name, **labels)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


@pytest.fixture(scope="module")
def defaults() -> Iterator[Server]:
    """The server at the default [http] settings."""
    server = Server({})
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def capped() -> Iterator[Server]:
    """A cap of 200 connections; a long head timeout, so that only the cap acts; admission
    that lets every request in (a 5 s deadline, no wait bound), so that requests stay busy."""
    server = Server(
        {
            "max_connections": 200, "header_timeout_s": 60, "body_timeout_s": 5,
            "token": TOKEN, "protect_predictions": True,
        },
        {"max_queue_wait_ms": 600_000, "max_queue_rows": 1000},
    )  # fmt: skip
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def tight() -> Iterator[Server]:
    """A wait bound of 1 ms, so that a few requests queued ahead are enough to refuse the next;
    a 3 s body timeout."""
    server = Server({"body_timeout_s": 3}, {"max_queue_wait_ms": 1})
    yield server
    assert server.stop() == 0


def server_sockets(port: int) -> tuple[int, int]:
    """The established connections to ``port`` on loopback, on the server's side; the number
    of them holding bytes the server has not read (``/proc/net/tcp``: the receive queue)."""
    established = unread = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        _, local, _, state, queues = line.split()[:5]
        if int(local.split(":")[1], 16) == port and state == "01":  # 01: ESTABLISHED
            established += 1
            unread += int(queues.split(":")[1], 16) > 0
    return established, unread


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.setblocking(False)
    return sock


def request(path: str = "/v1/models/m:predict", body: bytes = BODY) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def wait_closed(
    socks: dict[str, socket.socket], seconds: float, trickle: socket.socket | None = None
) -> dict[str, bytes]:
    """Read every socket until the server closes it or ``seconds`` pass; what each received
    before its close (sockets still open are left out). ``trickle`` gets one header line every
    2 s meanwhile."""
    selector = selectors.DefaultSelector()
    for name, sock in socks.items():
        selector.register(sock, selectors.EVENT_READ, name)
    received = {name: b"" for name in socks}
    closed: dict[str, bytes] = {}
    deadline = time.monotonic() + seconds
    next_line, line = time.monotonic() + 2, 0
    while len(closed) < len(socks) and time.monotonic() < deadline:
        if trickle is not None and time.monotonic() >= next_line and "slow" not in closed:
            with contextlib.suppress(OSError):
                trickle.send(f"X-Slow-{line}: {'a' * 20}\r\n".encode())
            next_line, line = next_line + 2, line + 1
        for key, _ in selector.select(timeout=0.2):
            name, sock = key.data, key.fileobj
            try:
                data = sock.recv(65536)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:  # reset: closed
                data = b""
            if data:
                received[name] += data
            else:
                closed[name] = received[name]
                selector.unregister(sock)
    selector.close()
    return closed


def http_ok(server: Server) -> int:
    """One well-behaved request on a new connection; its status."""
    return httpx.post(f"{server.url}/v1/models/m:predict", content=BODY, timeout=10,
                      headers={"content-type": "application/json", **AUTH}).status_code  # fmt: skip


def test_idle_and_slow_clients_are_closed_at_the_default_timeouts(defaults: Server) -> None:
    """Before: a client that sent nothing, or one header line every few seconds, was still
    connected a minute later. The defaults (10 s for the head, 5 s idle between requests)
    close all three kinds of connection here."""
    idle = connect(defaults)
    slow = connect(defaults)
    slow.send(PARTIAL_HEAD)
    kept = connect(defaults)
    kept.send(request())  # one complete request, then silence on the keep-alive connection
    socks = {"idle": idle, "slow": slow, "kept": kept}
    try:
        closed = wait_closed(socks, 25, trickle=slow)
    finally:
        for sock in socks.values():
            sock.close()
    assert set(closed) == {"idle", "slow", "kept"}, f"still open: {set(socks) - set(closed)}"
    assert closed["kept"].startswith(b"HTTP/1.1 200")  # it was answered, then closed when idle
    assert closed["slow"].startswith(b"HTTP/1.1 408")  # told why
    assert closed["idle"] == b""  # it never asked anything: closed without a word
    assert defaults.metric("livefit_http_connections_closed_total", reason="header_timeout") >= 1
    assert defaults.metric("livefit_http_connections_closed_total", reason="idle") >= 2
    assert http_ok(defaults) == 200


def test_slow_clients_past_the_cap_hold_no_descriptors(capped: Server) -> None:
    """400 slow clients against a cap of 200: the server's descriptors stay within the cap
    (they grew by one per connection), and well-behaved clients are served meanwhile: each new
    connection takes the place of the oldest one that has not sent a whole request head."""
    before = capped.fds()
    slow: list[socket.socket] = []
    statuses: list[int] = []
    try:
        for i in range(400):
            sock = socket.create_connection(("127.0.0.1", capped.port), timeout=5)
            sock.sendall(PARTIAL_HEAD)
            slow.append(sock)
            if i % 40 == 39:
                statuses.append(http_ok(capped))
        time.sleep(0.5)  # the server has seen every connection
        during = capped.fds()
        statuses += [http_ok(capped) for _ in range(10)]
        assert during - before <= 200 + 10, (before, during)
        assert statuses == [200] * len(statuses)
        evicted = capped.metric("livefit_http_connections_closed_total", reason="evicted")
        assert evicted >= 400 - 200
        assert capped.metric("livefit_http_connections") <= 200
    finally:
        for sock in slow:
            sock.close()


def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(capped: Server) -> None:
    """When every connection has a request in flight (here: bodies that never come), nothing
    can be evicted: a new connection is answered 503 with Retry-After and closed at once; the
    slots free up when those requests time out (408 after http.body_timeout_s)."""
    busy: list[socket.socket] = []
    head = (
        f"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: 100\r\n\r\n"
    ).encode()
    try:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", capped.port), timeout=5)
            sock.sendall(head)
            busy.append(sock)
        deadline = time.monotonic() + 30
        while (sockets := server_sockets(capped.port))[0] < len(busy) or sockets[1]:
            assert time.monotonic() < deadline, f"(established, unread): {sockets}"
            time.sleep(0.05)  # until every head is read, so that every connection is busy
        extra = socket.create_connection(("127.0.0.1", capped.port), timeout=5)
        extra.settimeout(5)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := extra.recv(65536):
                answer += chunk
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"retry-after: 1" in answer.lower()
        for sock in busy:  # the body timeout answers every stalled request
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 408")
    finally:
        for sock in busy:
            sock.close()
    assert http_ok(capped) == 200
    assert capped.metric("livefit_http_connections_closed_total", reason="refused") >= 1


def test_an_oversized_request_head_is_refused(capped: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", capped.port), timeout=10)
    try:
        with contextlib.suppress(OSError):
            sock.sendall(PARTIAL_HEAD + b"X-Big: " + b"a" * 80_000 + b"\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert http_ok(capped) == 200


def test_refused_from_the_head_while_bodies_are_awaited(tight: Server) -> None:
    """Requests whose bodies never come hold their places in the queue (they were admitted);
    once the expected wait is over the bound, the next ones are answered 429 from their heads
    alone, at once, with Retry-After. A refused request's unsent body is not waited for
    forever either: its connection closes after http.body_timeout_s. The admitted ones get
    408 then, and the server serves normally again."""
    head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n"
    socks = [socket.create_connection(("127.0.0.1", tight.port), timeout=5) for _ in range(30)]
    try:
        first: list[bytes] = []
        for sock in socks:
            sock.sendall(head)
        for sock in socks:
            sock.settimeout(20)
            first.append(sock.recv(65536))
        refused = [a for a in first if a.startswith(b"HTTP/1.1 429")]
        timed_out = [a for a in first if a.startswith(b"HTTP/1.1 408")]
        assert refused and timed_out and len(refused) + len(timed_out) == 30, first
        assert all(b"\r\nretry-after: " in a.lower() for a in refused)
        for sock, answer in zip(socks, first, strict=True):
            if answer.startswith(b"HTTP/1.1 429"):  # then closed: the body never came
                assert sock.recv(65536) == b""
    finally:
        for sock in socks:
            sock.close()
    assert http_ok(tight) == 200
    assert tight.metric("livefit_http_connections_closed_total", reason="body_timeout") >= 1
    assert tight.metric("livefit_predict_requests_total", model="m", code="429") >= len(refused)
    assert tight.metric("livefit_predict_refused_total", model="m", reason="wait") >= len(refused)


def test_predictions_taken_from_the_head_answer_as_the_app_does(capped: Server) -> None:
    """Admitted from its head, a prediction goes straight to its endpoint (not through the
    app's middleware and routing): same answers, on both protocols; the bearer token is still
    required (401 from the app without it)."""
    url = capped.url
    v1 = httpx.post(f"{url}/v1/models/m:predict", content=BODY, headers=AUTH, timeout=10)
    assert v1.status_code == 200 and v1.headers["x-model-version"] == "1"
    oip = {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]}
    v2 = httpx.post(f"{url}/v2/models/m/infer", json=oip, headers=AUTH, timeout=10)
    assert v2.status_code == 200 and v2.json()["outputs"][0]["data"] == [
        pytest.approx(v1.json()["predictions"][0][0])
    ]
    bad = httpx.post(f"{url}/v1/models/m:predict", content=b"[", headers=AUTH, timeout=10)
    assert bad.status_code == 400 and "error" in bad.json()
    assert httpx.post(f"{url}/v1/models/m:predict", content=BODY, timeout=10).status_code == 401
    unknown = httpx.post(f"{url}/v1/models/nope:predict", content=BODY, headers=AUTH, timeout=10)
    assert unknown.status_code == 404
    assert capped.metric("livefit_predict_requests_total", model="m", code="200") >= 2
