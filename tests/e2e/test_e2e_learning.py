"""End to end: a real mosquitto, the real ``livefit serve`` process, samples over MQTT.

5,000 samples of a noisy linear function arrive as single and batched messages, JSON and
msgpack, with malformed messages mixed in. Every good sample must be trained on, every bad
message counted and dead-lettered, and the prequential loss must fall by at least 10x.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import msgpack
import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model

TOPIC = "livefit/demo/samples"
DEAD = "livefit/demo/rejected"


def config(broker: Mosquitto, storage: Path, client_id: str, pipeline: str = "auto") -> str:
    demo = model(
        lines="learning_rate = 0.05\nseed = 1",
        train=f'max_batch_size = 128\npipeline = "{pipeline}"',
    )
    return learner_config(broker, storage, client_id, demo)


class Publisher:
    """A plain paho publisher that waits for every PUBACK; also collects dead letters."""

    def __init__(self, broker: Mosquitto) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.dead: list[dict[str, object]] = []
        self.got_dead = threading.Condition()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        self.client.subscribe(DEAD, qos=1)

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        with self.got_dead:
            self.dead.append(json.loads(message.payload))
            self.got_dead.notify_all()

    def send(self, payloads: list[bytes]) -> None:
        infos = [self.client.publish(TOPIC, p, qos=1) for p in payloads]
        for info in infos:
            info.wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def stream(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    weights = np.linspace(-1.0, 1.0, 8).reshape(8, 1)
    x = rng.normal(size=(n, 8))
    return x, x @ weights + 0.5 + rng.normal(scale=0.01, size=(n, 1))


def encode(x: np.ndarray, y: np.ndarray, fmt: str, seq: int) -> bytes:
    doc = {"x": x.tolist(), "y": y.tolist(), "seq": seq, "source": "e2e"}
    if x.shape[0] == 1:
        doc["x"], doc["y"] = x[0].tolist(), y[0].tolist()
    return json.dumps(doc).encode() if fmt == "json" else msgpack.packb(doc)


BAD = [
    b"not a sample",
    json.dumps({"x": [1, 2, 3], "y": [1]}).encode(),
    json.dumps({"x": [0.0] * 8}).encode(),
    b'{"x": [NaN, 0, 0, 0, 0, 0, 0, 0], "y": [1]}',
    msgpack.packb({"x": [[0.0] * 8] * 2, "y": [[1.0]] * 3}),
]


@pytest.mark.parametrize("pipeline", ["auto", "on"])
def test_learns_every_good_sample_and_rejects_bad_ones(
    broker: Mosquitto, tmp_path: Path, pipeline: str
) -> None:
    """Also with the training process's steps pipelined (``train.pipeline = "on"``; "auto"
    leaves it off on 2 cores, where the training process gets one)."""
    rng = np.random.default_rng(7)
    server = LivefitProcess(
        config(broker, tmp_path / "data", "e2e-learning", pipeline), tmp_path
    ).start()
    publisher = Publisher(broker)
    try:
        # Phase 1: 500 single-sample JSON messages; the untrained model scores them badly.
        x, y = stream(rng, 500)
        publisher.send([encode(x[i : i + 1], y[i : i + 1], "json", i) for i in range(500)])
        assert server.wait_for_metric("livefit_train_samples_total", 500, model="demo") == 500
        early_loss = server.metric("livefit_prequential_loss", model="demo")

        # Phase 2: 4,500 more as single and 50-sample batched messages, JSON and msgpack,
        # with malformed messages mixed in.
        payloads: list[bytes] = []
        x, y = stream(rng, 4500)
        seq = 500
        for start in range(0, 1500, 1):
            payloads.append(encode(x[start : start + 1], y[start : start + 1], "msgpack", seq))
            seq += 1
        for start in range(1500, 4500, 50):
            fmt = "json" if start % 100 == 0 else "msgpack"
            payloads.append(encode(x[start : start + 50], y[start : start + 50], fmt, seq))
            seq += 1
        for i, bad in enumerate(BAD):
            payloads.insert(200 + i * 300, bad)
        publisher.send(payloads)

        trained = server.wait_for_metric("livefit_train_samples_total", 5000, model="demo")
        assert trained == 5000
        assert server.metric("livefit_ingest_samples_total", model="demo") == 5000
        rejected = sum(
            value
            for (name, labels), value in server.metrics().items()
            if name == "livefit_ingest_messages_total" and ("outcome", "rejected") in labels
        )
        assert rejected == len(BAD)
        late_loss = server.metric("livefit_prequential_loss", model="demo")
        assert late_loss * 10 <= early_loss, (early_loss, late_loss)
        with publisher.got_dead:
            publisher.got_dead.wait_for(lambda: len(publisher.dead) == len(BAD), 10)
        reasons = sorted(str(d["reason"]) for d in publisher.dead)
        assert reasons == sorted(
            ["undecodable", "bad_shape", "bad_schema", "non_finite", "length_mismatch"]
        )
        assert server.metric("livefit_model_version", model="demo") >= 5000 / 128
    finally:
        publisher.close()
        assert server.stop() == 0
    if pipeline == "on":
        assert "training steps pipelined" in server.log.read_text()


@pytest.mark.parametrize(
    ("loss", "versions"),
    [("mse", 16), ("binary_crossentropy", 2)],
    ids=["regression", "classifier"],
)
def test_a_fresh_learners_first_message_is_batched_as_its_loss_asks(
    broker: Mosquitto, tmp_path: Path, loss: str, versions: int
) -> None:
    """README: a fresh regression model learns its first samples in small batches, each
    scored before it is learned (``train.fast_start_samples``); classifiers start without it.
    Through a real ``livefit serve``: one message of 25 samples with targets near 40 becomes
    four batches of four steps (5, 5, 10, 5), and the prequential MAE is not that of 25
    untrained predictions; with a classifier's loss the same message is one batch of its two
    steps."""
    rng = np.random.default_rng(3)
    demo = model(lines=f'seed = 1\nloss = "{loss}"', train="max_batch_size = 128")
    text = learner_config(broker, tmp_path / "data", "e2e-fast-start", demo)
    x, y = stream(rng, 25)
    y = y + 40.0 if loss == "mse" else (y > 0.5).astype(np.float64)
    publisher = Publisher(broker)
    server = LivefitProcess(text, tmp_path).start()
    try:
        publisher.send([encode(x, y, "msgpack", 0)])
        assert server.wait_for_metric("livefit_train_samples_total", 25, model="demo") == 25
        assert server.metric("livefit_model_version", model="demo") == versions
        if loss == "mse":
            mae = server.metric(
                "livefit_prequential_score", model="demo", metric="mae", window="cumulative"
            )
            assert mae < 0.5 * float(np.abs(y).mean()), mae  # untrained: about 40
    finally:
        publisher.close()
        assert server.stop() == 0


def test_a_restarted_learner_keeps_its_fast_start_count(broker: Mosquitto, tmp_path: Path) -> None:
    """docs/configuration.md: a model restored from its checkpoint goes on with the number of
    samples it had learned. After 25 samples, a clean stop and a restart on the same storage, a
    second message of 50 is two batches of 25 (the limit is what it learned: 25, then 50), eight
    steps; a count lost on restart would fast-start it again (5, 5, 10, 20, 10: 20 steps), and
    a restored model that skipped the fast start would take one batch (4 steps). The counter
    ``livefit_train_samples_total`` is the process's own, so it starts again at 0."""
    rng = np.random.default_rng(4)
    demo = model(lines="seed = 1", train="max_batch_size = 128")
    text = learner_config(broker, tmp_path / "data", "e2e-fast-restart", demo)
    publisher = Publisher(broker)
    try:
        server = LivefitProcess(text, tmp_path).start()
        x, y = stream(rng, 25)
        publisher.send([encode(x, y, "msgpack", 0)])
        assert server.wait_for_metric("livefit_train_samples_total", 25, model="demo") == 25
        first = server.metric("livefit_model_version", model="demo")
        assert server.stop() == 0
        server = LivefitProcess(text, tmp_path).start()
        x, y = stream(rng, 50)
        publisher.send([encode(x, y, "msgpack", 1)])
        assert server.wait_for_metric("livefit_train_samples_total", 50, model="demo") == 50
        assert server.metric("livefit_model_version", model="demo") == first + 8
    finally:
        publisher.close()
        assert server.stop() == 0
