"""Overload: well past the saturating load, excess requests get 429 at once, accepted ones are
answered, memory stays bounded, and the server recovers as soon as the load drops.

The load comes from a separate process (tests/loadgen_overload.py), bounded in time; the
figures (rates, latencies, RSS) go to artifacts/overload.json. Duration: LIVEFIT_OVERLOAD_S
(default 8 s here; the issue's 60 s is ``LIVEFIT_OVERLOAD_S=60``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model

ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def load(url: str, clients: int, seconds: float) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "loadgen_overload.py"), url, str(clients), str(seconds)],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_overload_sheds_with_429_and_recovers(broker: Mosquitto, tmp_path: Path) -> None:
    seconds = float(os.environ.get("LIVEFIT_OVERLOAD_S", "8"))
    serve = "max_batch_size = 32\nbatch_timeout_ms = 2\nmax_queue_rows = 64"
    lstm = model(builder="lstm", input_shape=[16, 4], serve=serve)
    config = learner_config(broker, tmp_path / "data", f"overload-{broker.port}", lstm)
    server = LivefitProcess(config, tmp_path).start()
    assert server.process is not None
    pid = server.process.pid
    try:
        base = load(server.url, 8, 3)
        rss_before = rss_mb(pid)
        over = load(server.url, 256, seconds)
        rss_after = rss_mb(pid)
        after = load(server.url, 8, 3)
        queue_rows = server.metric("livefit_predict_queue_rows", model="demo")
    finally:
        assert server.stop() == 0
    figures = {
        "baseline": base,
        "overload": over,
        "after": after,
        "rss_mb": [rss_before, rss_after],
    }
    (ROOT / "artifacts").mkdir(exist_ok=True)
    (ROOT / "artifacts" / "overload.json").write_text(json.dumps(figures, indent=2))
    assert over["status_429"] > 0 and over["retry_after_missing"] == 0  # excess is shed
    assert over["status_200"] > 0 and over["other"] == 0 and over["errors"] == 0  # no 5xx, no hang
    assert base["status_429"] == 0 and after["status_429"] == 0  # recovers at once
    assert after["status_200"] > 0 and queue_rows == 0
    assert rss_after - rss_before < 300, figures  # bounded: the queue, not the load, sets memory
