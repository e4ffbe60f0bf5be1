"""A publisher that restarts its numbering under the same ``source`` (issue 45 item 9), with
``dedup = true``: a real mosquitto and learner. Before, the second run lost every message up to
the first run's highest ``seq``, silently (500 acknowledged, dropped, no log line).

- ``livefit publish`` stamps each run with an ``epoch``: two runs with one ``--source-id``
  train every sample of both.
- A publisher without an epoch (a plain MQTT client numbering from 0 again) has its second
  run's messages dropped as duplicates, as dedup must for all it can tell, but counted as a
  restart and logged.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests import configs
from tests.e2e.test_labels_e2e import publish, steady, wait_for
from tests.layouts import metric


@pytest.fixture
def learner(tmp_path: Path, own_broker: Mosquitto) -> Iterator[LivefitProcess]:
    text = configs.learner_config(
        own_broker, tmp_path / "data", f"restarts-{own_broker.port}",
        configs.model("pub", input_shape=[2], lines="dedup = true\nseed = 3"),
    )  # fmt: skip
    with LivefitProcess(text, tmp_path).start() as process:
        yield process


def trained(learner: LivefitProcess) -> float:
    return metric(learner, "livefit_train_samples_total", model="pub")


def restarts(learner: LivefitProcess, evidence: str) -> float:
    return metric(learner, "livefit_ingest_sequence_restarts_total", model="pub", evidence=evidence)


def test_livefit_publish_run_twice_under_one_source_trains_both(
    learner: LivefitProcess, own_broker: Mosquitto
) -> None:
    for seed in (1, 2):
        done = subprocess.run(
            [sys.executable, "-m", "livefit", "publish", "--broker", own_broker.url, "--model",
             "pub", "--input-shape", "2", "--count", "500", "--batch", "10", "--seed",
             str(seed), "--source-id", "sensor-7", "--no-progress", "--no-check"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert wait_for(lambda: trained(learner), 1000) == 1000
    assert steady(lambda: trained(learner)) == 1000
    assert metric(learner, "livefit_ingest_duplicates_total", model="pub") == 0
    assert restarts(learner, "epoch") == 1
    assert "sensor-7" in learner.log.read_text()


def test_a_restart_without_an_epoch_is_counted_and_logged(
    learner: LivefitProcess, own_broker: Mosquitto
) -> None:
    def run(first_y: float) -> list[bytes]:
        return [
            msgpack.packb({"x": [[0.1 * i, 1.0]] * 10, "y": [[first_y]] * 10,
                           "source": "plain-client", "seq": i})
            for i in range(50)
        ]  # fmt: skip

    publish(own_broker, "livefit/pub/samples", run(1.0))
    assert wait_for(lambda: trained(learner), 500) == 500
    publish(own_broker, "livefit/pub/samples", run(2.0))  # numbering from 0 again
    duplicates = lambda: metric(learner, "livefit_ingest_duplicates_total", model="pub")  # noqa: E731
    assert wait_for(duplicates, 50) == 50
    assert trained(learner) == 500
    assert restarts(learner, "seq") == 1
    lines = [line for line in learner.log.read_text().splitlines() if "plain-client" in line]
    assert len(lines) == 1 and "restarted" in lines[0], lines
