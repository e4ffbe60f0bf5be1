"""Metrics as operators see them: promtool lints a live scrape of a learner and a replica, and a
real Prometheus, run with the repo's scrape config pointed at them, collects their series."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
needs_prometheus = pytest.mark.skipif(
    shutil.which("promtool") is None or shutil.which("prometheus") is None,
    reason="needs promtool and prometheus: apt-get install prometheus",
)


@pytest.fixture(scope="module")
def pair(
    broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LivefitProcess]]:
    workdir = tmp_path_factory.mktemp("prometheus")
    config = learner_config(broker, workdir / "data", f"prometheus-{broker.port}")
    learner = LivefitProcess(config, workdir).start()
    replica = LivefitProcess(config, workdir, command="replica")
    try:
        replica.start()
        with SamplePublisher(broker.url, "livefit/demo/samples", fmt="msgpack") as publisher:
            x, y = LinearStream(input_dim=8).sample(300)
            publisher.publish(x, y, batched=True)
        learner.wait_for_metric("livefit_train_samples_total", 300, model="demo")
        for server in (learner, replica):
            httpx.post(
                f"{server.url}/v1/models/demo:predict",
                json={"instances": x[:4].tolist()},
                timeout=10,
            )
        yield {"learner": learner, "replica": replica}
    finally:
        replica.stop()
        learner.stop()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield


# Families each process must and must not export: a process exports the families of the parts
# it runs, so a replica (no broker connection of its own, no trainer) has no series saying
# "disconnected" or "version 0" for an alert to fire on, and a learner none of a replica's.
OWNED = {
    "learner": (
        {"livefit_broker_connected", "livefit_train_samples_total", "livefit_model_version",
         "livefit_ingest_messages_total", "livefit_predict_requests_total",
         "livefit_serving_version", "livefit_published_version", "livefit_http_connections",
         "livefit_pending_predictions", "livefit_prediction_records_total",
         "livefit_model_ready"},
        {"livefit_weights_received_total", "livefit_weights_age_seconds"},
    ),
    "replica": (
        {"livefit_predict_requests_total", "livefit_serving_version",
         "livefit_weights_received_total", "livefit_weights_age_seconds",
         "livefit_http_connections", "livefit_model_ready"},
        {"livefit_broker_connected", "livefit_broker_connects_total", "livefit_train_samples_total",
         "livefit_train_steps_total", "livefit_model_version", "livefit_ingest_messages_total",
         "livefit_queue_depth", "livefit_published_version", "livefit_checkpoints_total",
         "livefit_pending_predictions", "livefit_labels_total", "livefit_storage_healthy"},
    ),
}  # fmt: skip


def families(text: str) -> set[str]:
    """The metric names a Prometheus text exposition declares (its ``# TYPE`` lines)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])  # a counter's is its samples' name, with _total
    return names


@pytest.mark.parametrize("role", ["learner", "replica"])
def test_each_process_exports_the_families_of_the_parts_it_runs(
    pair: dict[str, LivefitProcess], role: str
) -> None:
    declared = families(httpx.get(f"{pair[role].url}/metrics", timeout=10).text)
    required, foreign = OWNED[role]
    assert required <= declared, f"missing: {sorted(required - declared)}"
    assert not foreign & declared, f"foreign families: {sorted(foreign & declared)}"


@needs_prometheus
@pytest.mark.parametrize("role", ["learner", "replica"])
def test_promtool_lints_a_live_scrape(pair: dict[str, LivefitProcess], role: str) -> None:
    text = httpx.get(f"{pair[role].url}/metrics", timeout=10).text
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


@needs_prometheus
def test_real_prometheus_scrapes_learner_and_replica(
    pair: dict[str, LivefitProcess], tmp_path: Path
) -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"]["scrape_interval"] = config["global"]["scrape_timeout"] = "1s"
    targets = {"livefit-learner": [pair["learner"]], "livefit-replicas": [pair["replica"]]}
    for job in config["scrape_configs"]:
        job["static_configs"] = [
            {"targets": [f"127.0.0.1:{s.port}" for s in targets[job["job_name"]]]}
        ]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and seen != {"livefit-learner", "livefit-replicas"}:
            time.sleep(1)
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query",
                    params={"query": "livefit_serving_version"},
                    timeout=5,
                ).json()
            except httpx.HTTPError:
                continue
            seen = {series["metric"]["job"] for series in answer.get("data", {}).get("result", [])}
        assert seen == {"livefit-learner", "livefit-replicas"}, (
            tmp_path / "prometheus.log"
        ).read_text()[-2000:]
        up = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}, timeout=5
        ).json()
        assert all(series["value"][1] == "1" for series in up["data"]["result"])
    finally:
        process.terminate()
        process.wait(30)
