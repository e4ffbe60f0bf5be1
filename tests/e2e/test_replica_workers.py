"""``livefit replica --workers 2`` as real processes beside a learner and a real mosquitto.

Both workers serve on the one port with the learner's newest weights, ``/metrics`` on either
answers for both (each series labelled ``worker``); a SIGKILLed worker is started again while
the other keeps serving; SIGTERM stops the group with status 0; a SIGKILLed parent takes its
workers with it; a worker that cannot start stops the group with its status. (The learner's
own split into processes: ``test_learner_group.py``.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.e2e.test_weight_stream import ROWS, config, publish_samples, settle
from tests.layouts import with_workers
from tests.procfs import group_processes


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LivefitProcess, LivefitProcess, Mosquitto]]:
    root = tmp_path_factory.mktemp("workers")
    broker = Mosquitto(root / "broker").start()
    storage = root / "data"
    learner = LivefitProcess(config(broker, storage), root / "learner").start()
    replica = LivefitProcess(with_workers(config(broker, storage), 2), root / "replica", "replica")
    try:
        replica.start()
        yield learner, replica, broker
    finally:
        replica.stop()
        learner.stop()
        broker.stop()


def per_worker(server: LivefitProcess, name: str, **labels: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for (metric, pairs), value in server.metrics().items():
        found = dict(pairs)
        if metric == name and all(found.get(k) == v for k, v in labels.items()):
            values[found["worker"]] = values.get(found["worker"], 0.0) + value
    return values


def predict_on_new_connections(server: LivefitProcess, count: int) -> list[int]:
    codes = []
    for _ in range(count):
        with httpx.Client(timeout=10) as client:  # a new connection: any worker may take it
            try:
                response = client.post(
                    f"{server.url}/v1/models/demo:predict", json={"instances": ROWS[:1]}
                )
                codes.append(response.status_code)
            except httpx.TransportError:
                codes.append(0)
    return codes


def test_both_workers_serve_the_learners_weights_and_report_on_one_metrics(
    fleet: tuple[LivefitProcess, LivefitProcess, Mosquitto],
) -> None:
    learner, replica, broker = fleet
    publish_samples(broker, 400)
    version = settle(learner, 400)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        serving = per_worker(replica, "livefit_serving_version", model="demo")
        if sorted(serving) == ["0", "1"] and set(serving.values()) == {version}:
            break
        time.sleep(0.1)
    assert serving == {"0": version, "1": version}
    assert predict_on_new_connections(replica, 40) == [200] * 40
    answered = per_worker(replica, "livefit_predict_requests_total", model="demo", code="200")
    assert sorted(answered) == ["0", "1"] and sum(answered.values()) >= 40
    assert min(answered.values()) > 0, f"one worker answered nothing: {answered}"
    assert per_worker(replica, "livefit_workers_unreachable") in ({"0": 0.0}, {"1": 0.0})
    assert replica.process is not None  # the parent only supervises: no TensorFlow loaded
    assert "libtensorflow" not in Path(f"/proc/{replica.process.pid}/maps").read_text()
    if shutil.which("promtool"):  # the merged exposition is valid Prometheus text
        text = httpx.get(f"{replica.url}/metrics", timeout=10).text
        lint = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout


def test_a_killed_worker_is_started_again_while_the_other_serves(
    fleet: tuple[LivefitProcess, LivefitProcess, Mosquitto],
) -> None:
    _, replica, _ = fleet
    assert replica.process is not None
    workers = group_processes(replica.process.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    codes = predict_on_new_connections(replica, 20)  # the other worker takes them
    assert codes.count(200) >= 18, codes
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = group_processes(replica.process.pid)
        if len(now) == 2 and workers[0] not in now:
            serving = per_worker(replica, "livefit_serving_version", model="demo")
            if len(serving) == 2 and min(serving.values()) > 0:
                break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the killed worker was not back:\n{replica.log.read_text()[-3000:]}")
    log = replica.log.read_text()
    assert "exited with status -9; starting it again" in log
    assert "[worker 0]" in log and "[worker 1]" in log  # each worker's lines say whose


def test_sigterm_stops_the_group_and_a_killed_parent_takes_its_workers(
    fleet: tuple[LivefitProcess, LivefitProcess, Mosquitto], tmp_path: Path
) -> None:
    learner, _, _ = fleet
    text = with_workers(learner.config.read_text(), 2)
    for sig, status in ((signal.SIGTERM, 0), (signal.SIGKILL, -9)):
        group = LivefitProcess(text, tmp_path / sig.name, "replica").start()
        assert group.process is not None
        workers = group_processes(group.process.pid)
        assert len(workers) == 2
        deadline = time.monotonic() + 60  # both serve: SIGTERM meets two running servers
        while len(per_worker(group, "livefit_serving_version", model="demo")) < 2:
            assert time.monotonic() < deadline, group.log.read_text()[-3000:]
            time.sleep(0.2)
        started = time.monotonic()
        assert group.stop(sig, timeout=45) == status
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in workers):
            assert time.monotonic() < deadline, f"workers outlived the group after {sig.name}"
            time.sleep(0.05)
        assert time.monotonic() - started < 45


def test_a_worker_that_cannot_start_stops_the_group(tmp_path: Path) -> None:
    """No key to verify weights with: each worker fails at start, the group exits 2 at once
    instead of restarting them forever. (A replica waits ``broker.connect_timeout_s`` for the
    key of a learner starting beside it: 1 s here, not the default 10.)"""
    (tmp_path / "c.toml").write_text(
        '[broker]\nurl = "mqtt://127.0.0.1:9"\nconnect_timeout_s = 1\n[http]\nworkers = 2\n'
        f'[storage]\ndir = "{tmp_path / "data"}"\n'
        "[models.demo]\ninput_shape = [8]\noutput_shape = [1]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "replica", "--config", str(tmp_path / "c.toml"),
         "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode not in (0, None), done.stderr[-2000:]
    assert "before it served" in done.stderr, done.stderr[-2000:]
