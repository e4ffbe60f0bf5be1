"""deploy/haproxy/haproxy.cfg run by a real HAProxy (Debian: haproxy; skipped without it), in
front of a stand-in server on loopback that answers its readiness route and holds every
prediction: the front lets at most ``maxconn`` requests reach the server and refuses the rest
with 429 and Retry-After after ``timeout queue``. Only the listening address and the servers
are moved (the errorfile is copied beside the config, as compose mounts it); the check runs
on the file as shipped, as users run it. The references between the files: ``tests/unit/repo/test_deploy.py``.
"""

from __future__ import annotations

import re
import selectors
import shutil
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from livefit.server.runtime.local_process import LocalProcess, free_port, wait_listening
from tests.unit.repo.test_deploy import HAPROXY, HAPROXY_REFUSAL, ROOT, haproxy_lines

EXTRA = 10  # requests beyond maxconn: each must be refused


@pytest.mark.parametrize("cwd", [ROOT, ROOT / "deploy", Path("/")])
def test_the_shipped_config_passes_haproxy_check_as_users_run_it(cwd: Path) -> None:
    """``haproxy -c -f deploy/haproxy/haproxy.cfg`` in a checkout failed: the errorfile was
    named by its path in the container (issue 45). The file as shipped, from the checkout's
    root, from another directory, and by its absolute path."""
    haproxy = _require_haproxy()
    config = HAPROXY if cwd == Path("/") else HAPROXY.relative_to(cwd)
    result = subprocess.run(
        [haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30, cwd=cwd
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout


def test_front_holds_maxconn_at_the_server_and_refuses_the_rest(tmp_path: Path) -> None:
    haproxy = _require_haproxy()
    (default_server,) = haproxy_lines("backend servers", "default-server")
    maxconn = int(default_server[default_server.index("maxconn") + 1])
    port = free_port()
    with _holding_server() as server:
        config = _moved_config(tmp_path, port, server.server_address[1])
        argv = [haproxy, "-db", "-f", str(config)]
        with LocalProcess("haproxy", argv, tmp_path / "haproxy.log") as front:
            front.start()
            wait_listening("127.0.0.1", port, front.alive, "haproxy")
            _wait_ready(port)
            answers = _post_many(port, maxconn + EXTRA, timeout_s=20.0)
            deadline = time.monotonic() + 10.0
            while server.held < maxconn and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)  # one more beyond maxconn would show here
            held = server.held
    print(f"held at the server: {held}, answers: {[a.split(b' ', 2)[1] for a in answers]}")
    assert held == maxconn
    assert len(answers) == EXTRA
    for answer in answers:
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 429"), answer
        assert re.search(rb"\r\nretry-after: [1-9]", head), answer


def _require_haproxy() -> str:
    path = shutil.which("haproxy")
    if path is None:
        pytest.skip("haproxy is not on PATH (apt-get install haproxy)")
    return path


def _moved_config(directory: Path, port: int, server_port: int) -> Path:
    """The shipped configuration in ``directory``, with the errorfile beside it as compose
    mounts it, listening on ``port``, with one server (the stand-in on ``server_port``) in
    place of the compose services."""
    shutil.copy(HAPROXY_REFUSAL, directory / HAPROXY_REFUSAL.name)
    lines = []
    servers_done = False
    for line in HAPROXY.read_text().splitlines():
        words = line.split()
        if words[:1] == ["bind"]:
            line = f"    bind 127.0.0.1:{port}"
        elif words[:1] == ["server"]:
            if servers_done:
                continue
            line, servers_done = f"    server learner 127.0.0.1:{server_port}", True
        lines.append(line)
    config = directory / HAPROXY.name
    config.write_text("\n".join(lines) + "\n")
    return config


class _HoldingHandler(socketserver.StreamRequestHandler):
    """Answers GETs (the readiness route) with 200; holds a POST until the server stops."""

    server: _HoldingServer

    def handle(self) -> None:
        while not self.server.release.is_set():
            request = self.rfile.readline()
            if not request:
                return
            length = 0
            while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            self.rfile.read(length)
            if request.startswith(b"POST"):
                with self.server.lock:
                    self.server.held += 1
                self.server.release.wait(60)
                return
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")


class _HoldingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the front opens up to maxconn connections at once

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HoldingHandler)
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.held = 0


@contextmanager
def _holding_server() -> Iterator[_HoldingServer]:
    server = _HoldingServer()
    thread = threading.Thread(target=server.serve_forever, name="holding-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def _wait_ready(port: int, timeout_s: float = 30.0) -> None:
    """Until the front answers the readiness route 200 (its health check saw the server)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
            if sock.recv(4096).startswith(b"HTTP/1.1 200"):
                return
        time.sleep(0.2)
    raise AssertionError("the front never answered its readiness route 200")


def _post_many(port: int, count: int, timeout_s: float) -> list[bytes]:
    """Send ``count`` predictions on as many connections at once; the answers that came back
    within ``timeout_s`` (once the expected number beyond the held ones has)."""
    body = b'{"instances": [[0.0]]}'
    request = (
        b"POST /v1/models/demo:predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]
    answers: dict[socket.socket, bytes] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.sendall(request)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(answers) < EXTRA:
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                answers[sock] = answers.get(sock, b"") + sock.recv(65536)
        time.sleep(0.5)  # any answer beyond the expected ones would show here
        for key, _ in selector.select(timeout=0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            answers[sock] = answers.get(sock, b"") + sock.recv(65536)
    for sock in socks:
        sock.close()
    return [answer for answer in answers.values() if answer]
