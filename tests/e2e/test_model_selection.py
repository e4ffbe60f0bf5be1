"""Online model selection through a real mosquitto and a real ``livefit serve`` (issue 30, item 3).

A linear regression model whose configured learning rate (SGD at 1e-5) barely moves it, with
one more candidate, ``fast`` (SGD at 0.05), on a linear stream: ``fast`` must win the
selection, the switch must be counted, scored in ``/metrics`` and sent as a ``selection``
event on the events topic, and the predictions served over HTTP must follow ``fast`` (the
configured candidate still predicts about 0 where the truth is 2).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model
from tests.e2e.test_hardening import publish_raw
from tests.layouts import metric

TOPIC = "livefit/demo/samples"
EVENTS = "livefit/demo/events"
W = np.array([0.5, -0.3, 0.2, 0.1])
TRUTH_AT_ZERO = 2.0
MESSAGE = 20  # samples per message


def messages(rng: np.random.Generator, count: int) -> list[bytes]:
    x = rng.normal(size=(count, 4))
    y = TRUTH_AT_ZERO + x @ W + rng.normal(scale=0.01, size=count)
    return [
        json.dumps({"x": x[i : i + MESSAGE].tolist(), "y": y[i : i + MESSAGE, None].tolist()})
        .encode()
        for i in range(0, count, MESSAGE)
    ]  # fmt: skip


class Events:
    """Collects the JSON events published on the model's events topic."""

    def __init__(self, broker: Mosquitto) -> None:
        self.seen: list[dict[str, object]] = []
        self.changed = threading.Condition()
        self.subscribed = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        self.client.subscribe(EVENTS, qos=1)
        assert self.subscribed.wait(10)

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        with self.changed:
            self.seen.append(json.loads(message.payload))
            self.changed.notify_all()

    def wait_for(self, kind: str, timeout: float) -> list[dict[str, object]]:
        with self.changed:
            self.changed.wait_for(lambda: any(e["event"] == kind for e in self.seen), timeout)
            return [e for e in self.seen if e["event"] == kind]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def predict_at_zero(server: LivefitProcess) -> float:
    body = {"instances": [[0.0, 0.0, 0.0, 0.0]]}
    response = httpx.post(f"{server.url}/v1/models/demo:predict", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return float(response.json()["predictions"][0][0])


def test_the_better_candidate_wins_and_serving_follows_it(
    broker: Mosquitto, tmp_path: Path
) -> None:
    rng = np.random.default_rng(30)
    demo = model(
        input_shape=(4,),
        lines='seed = 1\noptimizer = "sgd"\nlearning_rate = 1e-5\ntarget_scaling = "none"',
        selection=(
            "enabled = true\nwindow = 200\nmargin = 0.2\nmin_samples_between_switches = 200\n"
            '[[models.demo.selection.candidates]]\nname = "fast"\nlearning_rate = 0.05'
        ),
        train="max_batch_size = 20",  # a step per message: 100 steps
        # the experts' linear expert (its own SGD) would rescue the slow configured candidate:
        # selection is shown between networks alone
        experts="enabled = false",
    )
    config = learner_config(broker, tmp_path / "data", "model-selection", demo)
    server = LivefitProcess(config, tmp_path).start()
    events = Events(broker)
    try:
        assert metric(server, "livefit_selection_served", model="demo", candidate="configured") == 1
        total = 2000
        assert publish_raw(broker, TOPIC, iter(messages(rng, total))) == total // MESSAGE
        assert server.wait_for_metric("livefit_train_samples_total", total, model="demo") == total
        switches = events.wait_for("selection", timeout=30)
        assert [(e["previous"], e["served"]) for e in switches] == [("configured", "fast")]
        assert metric(server, "livefit_selection_switches_total", model="demo") == 1
        assert metric(server, "livefit_selection_served", model="demo", candidate="fast") == 1
        fast = metric(server, "livefit_selection_score", model="demo", candidate="fast")
        configured = metric(server, "livefit_selection_score", model="demo", candidate="configured")
        print(f"windowed loss: fast {fast:.4g}, configured {configured:.4g}")
        assert fast < 0.1 < 1.0 < configured
        deadline = time.monotonic() + 30  # the served weights catch up with the trainer's
        served = predict_at_zero(server)
        while abs(served - TRUTH_AT_ZERO) > 0.1 and time.monotonic() < deadline:
            time.sleep(0.1)
            served = predict_at_zero(server)
        print(f"served prediction at 0: {served:.4f} (truth {TRUTH_AT_ZERO})")
        assert abs(served - TRUTH_AT_ZERO) < 0.1, served
        # the model's own prequential loss is the served candidate's: it fell with the switch
        assert metric(server, "livefit_prequential_loss", model="demo") < 0.5 * configured
    finally:
        events.close()
        assert server.stop() == 0
