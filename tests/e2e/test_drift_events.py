"""A concept switch through a real mosquitto and a real ``livefit serve``: the drift detector
fires on the prequential loss, the detection is counted, and a ``drift`` event naming the
default reaction goes out on the model's events topic (docs/mqtt.md, the events topic). The
events are published by the same code as the selection events (``test_model_selection``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model
from tests.e2e.test_hardening import publish_raw
from tests.e2e.test_model_selection import TOPIC, Events
from tests.layouts import metric

W = np.array([0.5, -0.3, 0.2, 0.1])
MESSAGE = 20  # samples per message


def concept(rng: np.random.Generator, count: int, sign: float) -> list[bytes]:
    """``count`` samples of y = 2 + sign * x.W, ``MESSAGE`` to a message."""
    x = rng.normal(size=(count, 4))
    y = 2.0 + sign * (x @ W) + rng.normal(scale=0.01, size=count)
    return [
        json.dumps({"x": x[i : i + MESSAGE].tolist(), "y": y[i : i + MESSAGE, None].tolist()})
        .encode()
        for i in range(0, count, MESSAGE)
    ]  # fmt: skip


def test_a_concept_switch_is_detected_counted_and_reported(
    broker: Mosquitto, tmp_path: Path
) -> None:
    rng = np.random.default_rng(28)
    demo = model(input_shape=(4,), lines="seed = 1", train="max_batch_size = 20")
    config = learner_config(broker, tmp_path / "data", "drift-events", demo)
    server = LivefitProcess(config, tmp_path).start()
    events = Events(broker)
    try:
        before, after = 3000, 2000
        assert publish_raw(broker, TOPIC, iter(concept(rng, before, 1.0))) == before // MESSAGE
        assert server.wait_for_metric("livefit_train_samples_total", before, model="demo") == before
        calm = metric(server, "livefit_drift_detected_total", model="demo")
        assert publish_raw(broker, TOPIC, iter(concept(rng, after, -1.0))) == after // MESSAGE
        total = before + after
        assert server.wait_for_metric("livefit_train_samples_total", total, model="demo") == total
        drifts = events.wait_for("drift", timeout=30)
        detected = metric(server, "livefit_drift_detected_total", model="demo")
        print(f"drift detections: {calm} before the switch, {detected} in all; events {drifts}")
        assert detected > calm and drifts, (calm, detected, drifts)
        last = drifts[-1]
        assert last["model"] == "demo" and last["reaction"] == "flush_replay", last
        assert before < int(last["samples_seen"]) <= total, last  # after the switch
    finally:
        events.close()
        assert server.stop() == 0
