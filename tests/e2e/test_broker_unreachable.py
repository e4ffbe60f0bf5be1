"""``livefit serve`` with nothing listening at its broker URL: it keeps saying so.

The log has a line at the first failed attempt and then lines further and further apart with
the count of attempts (not one per attempt, not silence after the first), and readiness names
the broker as unreachable, with its address, until it comes; then it connects and is ready.
The learner runs as a user's config leaves it: the default split, whose readiness names the
process with the problem (``training: ...``).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from pathlib import Path

import httpx

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto

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


def readiness(server: LivefitProcess) -> tuple[int, dict[str, object]]:
    try:
        response = httpx.get(f"{server.url}/v2/health/ready", timeout=2)
    except httpx.HTTPError:
        return 0, {}
    return response.status_code, response.json()


def test_an_unreachable_broker_is_logged_with_back_off_and_named_by_readiness(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = LivefitProcess(CONFIG.format(port=port, storage=tmp_path / "data"), tmp_path)
    server.start(ready_timeout_s=None)
    try:
        deadline = time.monotonic() + 90
        while readiness(server)[1].get("problems") in (None, ["starting"]):
            assert time.monotonic() < deadline, server.log.read_text()[-3000:]
            time.sleep(0.2)
        wait_attempts(server, 7)  # one a second: the log's lines at 1, 2 and 4, not one each
        status, body = readiness(server)
        assert status == 503
        problems = body["problems"]
        assert isinstance(problems, list) and len(problems) == 1, body
        assert re.fullmatch(
            rf"training: model far: MQTT broker at mqtt://127\.0\.0\.1:{port} unreachable "
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

        broker = Mosquitto(tmp_path / "mosquitto", port=port)
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


REFUSED = re.compile(
    r"MQTT broker at (\S+) refused the connection for client id '[^']+': (.+?) \((\d+) connection"
)


def wait_for_problems(server: LivefitProcess, pattern: str, timeout: float = 90) -> list[str]:
    """Readiness's problems once one matches ``pattern`` (503 all along)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = readiness(server)
        problems = body.get("problems") or []
        if any(re.search(pattern, problem) for problem in problems):
            assert status == 503, body
            return problems
        assert server.process is not None and server.process.poll() is None, server.log.read_text()
        assert time.monotonic() < deadline, (body, server.log.read_text()[-3000:])
        time.sleep(0.2)


def wait_attempts(server: LivefitProcess, count: int, timeout: float = 90) -> None:
    """Until readiness's one problem counts ``count`` failed connection attempts or more
    (one a second; seconds more on a loaded host)."""
    deadline = time.monotonic() + timeout
    while True:
        problems = readiness(server)[1].get("problems") or []
        made = re.search(r"\((\d+) connection attempts? failed", " ".join(map(str, problems)))
        if made is not None and int(made[1]) >= count:
            return
        assert time.monotonic() < deadline, (problems, server.log.read_text()[-3000:])
        time.sleep(0.2)


def dashboard_problems(server: LivefitProcess) -> list[str]:
    return httpx.get(f"{server.url}/api/stats", timeout=5).json()["problems"]


def test_wrong_broker_credentials_are_said_plainly_once_then_with_back_off(
    tmp_path: Path,
) -> None:
    """A password the broker refuses: the log names the refusal and what to check (not a line
    per attempt), readiness and the dashboard name it too; nothing is silent."""
    passwd = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "livefit", "right"], check=True)
    broker = Mosquitto(tmp_path / "mosquitto", extra_config=f"password_file {passwd}\n")
    broker.start()
    config = CONFIG.format(port=broker.port, storage=tmp_path / "data").replace(
        "mqtt://127.0.0.1", "mqtt://livefit:Xq7-not-it@127.0.0.1"
    )
    server = LivefitProcess(config, tmp_path)
    server.start(ready_timeout_s=None)
    try:
        problems = wait_for_problems(server, "refused the connection")
        assert len(problems) == 1, problems
        assert re.fullmatch(
            rf"training: model far: MQTT broker at mqtt://livefit@127\.0\.0\.1:{broker.port} "
            r"refused the "
            r"connection: (Not authorized|Bad user name or password); check the user and "
            r"password in broker\.url.* \(\d+ connection attempts? failed\)",
            problems[0],
        ), problems
        assert "refused the connection" in " ".join(dashboard_problems(server))
        wait_attempts(server, 6)  # one a second
        log = server.log.read_text()
        counts = [int(m[3]) for m in REFUSED.finditer(log)]
        assert counts and counts[0] == 1, log[-3000:]
        assert len(counts) <= 5, counts  # with back-off, not one line per attempt
        assert "Xq7-not-it" not in log  # the password is never logged
    finally:
        server.stop()
        broker.stop()


def test_a_replica_says_the_broker_is_unreachable_and_then_that_weights_are_missing(
    tmp_path: Path,
) -> None:
    """The replica's readiness and dashboard name the unreachable broker (logged with back-off
    like the learner's), then, once connected, the weights it is still waiting for."""
    port = free_port()
    config = CONFIG.format(port=port, storage=tmp_path / "data") + (
        "[models.far.weights]\nallow_unsigned = true\n"
    )
    server = LivefitProcess(config, tmp_path, command="replica")
    server.start(ready_timeout_s=None)
    try:
        problems = wait_for_problems(server, "unreachable")
        assert re.fullmatch(
            rf"model far: MQTT broker at mqtt://127\.0\.0\.1:{port} unreachable "
            r"\(\d+ connection attempts? failed\)",
            problems[0],
        ), problems
        assert any("unreachable" in problem for problem in dashboard_problems(server))
        assert re.search(r"weight stream of far: MQTT broker at \S+ unreachable for client id "
                         r"'[^']+' \(1 connection attempt failed\)",
                         server.log.read_text())  # fmt: skip

        broker = Mosquitto(tmp_path / "mosquitto", port=port)
        broker.start()
        try:
            deadline = time.monotonic() + 30
            while any("unreachable" in p for p in wait_for_problems(server, "no weights yet")):
                assert time.monotonic() < deadline, server.log.read_text()[-3000:]
                time.sleep(0.2)
            problems = wait_for_problems(server, "no weights yet")
            assert problems == [
                "model far: no weights yet on livefit/far/weights (is a learner for this model "
                "running on this broker?)"
            ], problems
        finally:
            assert server.stop() == 0
            broker.stop()
    finally:
        server.stop()
