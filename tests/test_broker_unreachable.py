"""``livefit serve`` with nothing listening at its broker URL: it keeps saying so.

The log has a line at the first failed attempt and then lines further and further apart with
the count of attempts (not one per attempt, not silence after the first), and readiness names
the broker as unreachable, with its address, until it comes; then it connects and is ready.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.mqtt_broker import MosquittoBroker, free_port
from tests.server_process import ServerProcess

CONFIG = """
[broker]
url = "mqtt://127.0.0.1:{port}"
client_id = "unreachable-{port}"
connect_timeout_s = 1
reconnect_min_s = 1
reconnect_max_s = 1
session_expiry_s = 0
[storage]
dir = "{storage}"
wal = false
[models.far]
builder = "linear"
input_shape = [2]
output_shape = [1]
"""
FAILED = re.compile(r"MQTT broker at (\S+) unreachable for client id '[^']+' \((\d+) connection")


def readiness(server: ServerProcess) -> tuple[int, dict[str, object]]:
    try:
        response = httpx.get(f"{server.url}/v2/health/ready", timeout=2)
    except httpx.HTTPError:
        return 0, {}
    return response.status_code, response.json()


def start_unready(server: ServerProcess) -> None:
    """Start the server without waiting for readiness (ServerProcess.start waits for it)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    with server.log.open("wb") as log:
        server.process = subprocess.Popen(
            [sys.executable, "-m", "livefit", "serve", "--config", str(server.config),
             "--port", str(server.port)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


def test_an_unreachable_broker_is_logged_with_back_off_and_named_by_readiness(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = ServerProcess(CONFIG.format(port=port, storage=tmp_path / "data"), tmp_path)
    start_unready(server)
    try:
        deadline = time.monotonic() + 90
        while readiness(server)[1].get("problems") in (None, ["starting"]):
            assert time.monotonic() < deadline, server.log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(6.0)  # about seven attempts, one a second
        status, body = readiness(server)
        assert status == 503
        problems = body["problems"]
        assert isinstance(problems, list) and len(problems) == 1, body
        assert re.fullmatch(
            rf"model far: MQTT broker at mqtt://127\.0\.0\.1:{port} unreachable "
            r"\(\d+ connection attempts failed\)",
            problems[0],
        ), body

        found = [(m[1], int(m[2])) for m in FAILED.finditer(server.log.read_text())]
        counts = [count for _, count in found]
        assert {address for address, _ in found} == {f"mqtt://127.0.0.1:{port}"}
        steps = [b - a for a, b in itertools.pairwise(counts)]
        assert counts[0] == 1, counts  # the first failure at once
        assert 3 <= len(counts) <= 5, counts  # then further apart: not one line per attempt
        assert all(step > 0 for step in steps) and steps == sorted(steps), counts
        assert counts[-1] >= 4, counts  # attempts go on (one a second) and are counted

        broker = MosquittoBroker(tmp_path / "mosquitto", port=port)
        broker.start()
        try:
            server.wait_ready(timeout=30)
            assert re.search(r"MQTT connected to \S+ \(session new\) after \d+ failed attempts",
                             server.log.read_text())  # fmt: skip
        finally:
            assert server.stop() == 0
            broker.stop()
    finally:
        server.stop()
