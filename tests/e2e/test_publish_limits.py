"""What livefit publishes against brokers as users run them (issue 26, items 7 to 9): a broker
packet limit smaller than a snapshot, an ACL that refuses a replica's publishes, and someone
else's message on a learner's own weight topic. Real mosquitto, real ``livefit`` processes.

- A broker with ``max_packet_size 8000`` and a ~10 KB snapshot: the learner never sends a
  PUBLISH over the limit (mosquitto would drop the connection, ingestion with it, and paho would
  resend it at every reconnect), announces the snapshot by a manifest, trains each sample once
  on one connection, and a replica pulls the weights and serves the learner's version.
- An ACL that lets a replica's broker user only read weights: its label answers 502 naming the
  refusal, its prediction records count as refused, both in
  ``livefit_broker_publish_refused_total``; the compose ACL (deploy/mosquitto/acl) lets the
  replica user publish what replicas publish.
- A message signed by another key, retained on a learner's weight topic: the learner logs an
  error naming the key id and lineage, counts it, and puts its own snapshot back, so a replica
  started after that serves the learner's version.
- A second learner with the first one's client id (other storage): the first one's session is
  taken over; its readiness stays 503 naming the take-over (it does not flap back to 200 by
  taking the session back a second later), and the second one keeps its connection.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.format import open_envelope
from livefit.server.weights.keys import SigningKey
from tests.configs import learner_config, model
from tests.layouts import metric
from tests.weight_envelopes import Weights, envelope

DEPLOY_ACL = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "acl"
TOPIC = "livefit/demo/weights"
T = TypeVar("T")
ROWS = np.random.default_rng(5).normal(size=(3, 8)).round(3).tolist()


def wait_until(read: Callable[[], T], expected: T, timeout_s: float = 30.0) -> T:
    """Poll ``read()`` until it returns ``expected`` (or the time is up); the last value."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while value != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def retained(broker: Mosquitto, topic: str, auth: tuple[str, str] | None = None) -> bytes:
    """The retained message on ``topic`` now."""
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    if auth:
        client.username_pw_set(*auth)
    messages: list[bytes] = []
    client.on_message = lambda _c, _u, message: messages.append(bytes(message.payload))
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        deadline = time.monotonic() + 5
        while not messages and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        client.disconnect()
        client.loop_stop()
    assert messages, f"no retained message on {topic}"
    return messages[0]


def test_snapshot_over_the_broker_packet_limit_goes_by_manifest(tmp_path: Path) -> None:
    """mosquitto ``max_packet_size 8000`` (said in CONNACK) and a ~10 KB snapshot: 500 samples
    trained exactly once, one connection and no disconnect, every snapshot a manifest, none
    refused, and a replica serves the learner's version pulled over HTTP."""
    broker = Mosquitto(tmp_path / "mosquitto", extra_config="max_packet_size 8000\n").start()
    options = "builder_options = { hidden_units = [256] }\nlearning_rate = 0.01\nseed = 11"
    demo = model(builder="mlp", lines=options, weights="publish_interval_s = 0.2")
    text = learner_config(broker, tmp_path / "data", f"limit-{broker.port}", demo)
    learner = LivefitProcess(text, tmp_path).start()
    replica = LivefitProcess(
        text + f'pull_url = "{learner.url}"\n', tmp_path, command="replica"
    )  # fmt: skip
    try:
        replica.start(ready_timeout_s=None)
        with SamplePublisher(broker.url, "livefit/demo/samples", fmt="msgpack") as publisher:
            stream = LinearStream(input_dim=8, seed=2)
            for _ in range(10):
                x, y = stream.sample(50)
                publisher.publish(x, y, batched=True)
        trained = lambda: metric(learner, "livefit_train_samples_total", model="demo")  # noqa: E731
        assert wait_until(trained, 500) == 500
        version = lambda: metric(learner, "livefit_model_version", model="demo")  # noqa: E731
        published = lambda: metric(learner, "livefit_published_version", model="demo")  # noqa: E731
        assert wait_until(published, version(), 10) == version()
        latest = int(version())
        assert metric(learner, "livefit_weights_payload_bytes", model="demo") > 8000
        manifests = metric(learner, "livefit_weights_published_total", model="demo",
                           kind="manifest")  # fmt: skip
        assert manifests >= 1
        assert metric(learner, "livefit_weights_published_total", model="demo", kind="inline") == 0
        assert metric(learner, "livefit_broker_disconnects_total") == 0
        assert metric(learner, "livefit_broker_connects_total") == 1
        time.sleep(1)  # nothing is trained twice: a redelivery after a reconnect would be
        assert trained() == 500
        assert open_envelope(retained(broker, TOPIC)).header.kind == "manifest"
        replica.wait_ready()
        serving = lambda: int(replica.metric("livefit_serving_version", model="demo"))  # noqa: E731
        assert wait_until(serving, latest) == latest
        assert replica.metric("livefit_weights_received_total", model="demo",
                              outcome="pull_failed") == 0  # fmt: skip
        assert "another client probably uses client id" not in learner.log.read_text()
    finally:
        replica.stop()
        assert learner.stop() == 0
        broker.stop()


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """mosquitto with the compose deployment's ACL and its users, plus ``reader``: a user that
    may only read weights (what the compose ACL gave replicas before)."""
    directory = tmp_path / "auth"
    directory.mkdir()
    acl = directory / "acl"
    acl.write_text(DEPLOY_ACL.read_text() + "\nuser reader\ntopic read livefit/+/weights\n")
    passwd = directory / "passwd"
    for number, user in enumerate(("livefit", "replica", "publisher", "reader")):
        create = ["-c"] if number == 0 else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", str(passwd), user, f"{user}-pw"], check=True
        )
    passwd.chmod(0o600)
    broker = Mosquitto(
        tmp_path / "mosquitto", extra_config=f"password_file {passwd}\nacl_file {acl}\n"
    )
    yield broker.start()
    broker.stop()


def test_publishes_the_broker_refuses_are_counted(acl_broker: Mosquitto, tmp_path: Path) -> None:
    """A replica whose broker user may only read weights: its label is answered 502 naming the
    refusal (not 202), its prediction records count as refused, and both are in
    ``livefit_broker_publish_refused_total``. The compose ACL's replica user may publish both."""
    port = acl_broker.port
    demo = model(labels="tick_s = 0.2", weights="publish_interval_s = 0.2")
    learner_text = learner_config(
        f"mqtt://livefit:livefit-pw@127.0.0.1:{port}", tmp_path / "data", f"acl-{port}", demo
    )  # fmt: skip
    learner = LivefitProcess(learner_text, tmp_path).start()
    replica_text = learner_text.replace("livefit:livefit-pw@", "reader:reader-pw@")
    replica = LivefitProcess(replica_text, tmp_path, command="replica")
    try:
        replica.start()
        answer = httpx.post(f"{replica.url}/v1/models/demo/labels", json={"id": "l1", "y": [1.0]})
        assert answer.status_code == 502, answer.text
        assert "Not authorized" in answer.text
        predicted = httpx.post(
            f"{replica.url}/v1/models/demo:predict", json={"instances": ROWS, "ids": [1, 2, 3]}
        )
        assert predicted.status_code == 200
        records = lambda: replica.metric(  # noqa: E731
            "livefit_prediction_records_total", model="demo", outcome="refused"
        )
        assert wait_until(records, 3.0, 10) == 3.0
        for topic in ("livefit/demo/labels", "livefit/demo/predictions"):
            refused = replica.metric(
                "livefit_broker_publish_refused_total", topic=topic, reason="Not authorized"
            )
            assert refused == 1, topic
        assert "was refused: Not authorized" in replica.log.read_text()
    finally:
        replica.stop()
        assert learner.stop() == 0
    # the compose ACL: a replica's user publishes its labels and prediction records
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.username_pw_set("replica", "replica-pw")
    answers: list[bool] = []
    client.on_publish = lambda _c, _u, _mid, reason, _p: answers.append(reason.is_failure)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for topic in ("livefit/demo/labels", "livefit/demo/predictions"):
            client.publish(topic, b"{}", qos=1).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()
    assert answers == [False, False]


def test_foreign_retained_weights_are_reported_and_replaced(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Weights signed by another key, published retained on the learner's topic while it runs
    (another learner of the model, or a third party): the learner logs an error naming the key
    id and lineage, counts it, and its own snapshot is the retained message again within a few
    seconds; a replica started then serves the learner's version (not "bad_signature")."""
    topic = f"limits-{broker.port}/demo/weights"
    demo = model(weights=f'publish_interval_s = 0.2\ntopic = "{topic}"')
    text = learner_config(broker, tmp_path / "data", f"foreign-{broker.port}", demo)
    learner = LivefitProcess(text, tmp_path).start()
    replica = LivefitProcess(text, tmp_path, command="replica")
    try:
        own = open_envelope(retained(broker, topic)).header
        stranger = SigningKey.generate()
        client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        try:
            foreign = envelope(stranger, Weights.of("linear"), topic=topic, version=10**6)
            client.publish(topic, foreign, qos=1, retain=True).wait_for_publish(5)
        finally:
            client.disconnect()
            client.loop_stop()
        back = lambda: open_envelope(retained(broker, topic)).header.key_id  # noqa: E731
        assert wait_until(back, own.key_id, 5) == own.key_id
        assert metric(learner, "livefit_weights_foreign_total", model="demo") == 1
        header = open_envelope(retained(broker, topic)).header
        assert (header.lineage, header.version) == (own.lineage, own.version)
        log = learner.log.read_text()
        assert stranger.key_id in log and "a" * 32 in log and own.key_id in log
        assert metric(learner, "livefit_weights_published_total", model="demo", kind="restore") == 1
        replica.start()  # ready once it holds the weights; the gauge follows their swap
        served = lambda: int(replica.metric("livefit_serving_version", model="demo"))  # noqa: E731
        assert wait_until(served, own.version) == own.version
    finally:
        replica.stop()
        assert learner.stop() == 0


def test_a_session_taken_over_holds_readiness_at_503(broker: Mosquitto, tmp_path: Path) -> None:
    """Two learners with one client id take the session from each other: within seconds one of
    them answers 503 naming the take-over and the client id, for 4 s on end (before: both
    flapped 503/200 every second), and the other keeps the session, ready."""
    client_id = f"twin-{broker.port}"
    learners = [
        LivefitProcess(learner_config(broker, tmp_path / name, client_id), tmp_path)
        for name in ("a", "b")
    ]
    try:
        learners[0].start()
        learners[1].start()

        def taken() -> LivefitProcess | None:
            for learner in learners:
                if "taken over" in httpx.get(f"{learner.url}/v2/health/ready", timeout=5).text:
                    return learner
            return None

        deadline = time.monotonic() + 20
        while (waiting := taken()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert waiting is not None, "neither learner says its session was taken over"
        holding = learners[1] if waiting is learners[0] else learners[0]
        connects = metric(holding, "livefit_broker_connects_total")
        disconnects = metric(holding, "livefit_broker_disconnects_total")
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            answer = httpx.get(f"{waiting.url}/v2/health/ready", timeout=5)
            assert answer.status_code == 503, answer.text
            assert f"client id '{client_id}-demo'" in answer.text
            time.sleep(0.1)
        assert metric(holding, "livefit_broker_connects_total") == connects
        assert metric(holding, "livefit_broker_disconnects_total") == disconnects
        assert httpx.get(f"{holding.url}/v2/health/ready", timeout=5).status_code == 200
    finally:
        for learner in learners:
            learner.stop()


def test_a_manifest_over_the_packet_limit_is_failed_not_published(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """A packet limit that not even the manifest fits (1024 bytes and a 450-byte weight topic,
    which the signed header repeats): before, each snapshot was counted and logged as published
    (``kind="manifest"``) though nothing was sent. Now each is counted as failed, with one error
    line saying replicas get no weights; nothing counts as published; the learner itself keeps
    training and serving (readiness 200: the replicas, which get nothing, are not ready)."""
    topic = "livefit/demo/weights/" + "w" * 429
    demo = model(weights=f'publish_interval_s = 0.2\ntopic = "{topic}"')
    text = learner_config(broker, tmp_path / "data", f"manifest-{broker.port}", demo,
                          broker_lines="max_packet_size_bytes = 1024")  # fmt: skip
    learner = LivefitProcess(text, tmp_path).start()
    try:
        with SamplePublisher(broker.url, "livefit/demo/samples", fmt="msgpack") as publisher:
            x, y = LinearStream(input_dim=8, seed=2).sample(50)
            publisher.publish(x, y, batched=True)
        trained = lambda: metric(learner, "livefit_train_samples_total", model="demo")  # noqa: E731
        assert wait_until(trained, 50) == 50
        failed = lambda: metric(learner, "livefit_weights_publish_failed_total", model="demo")  # noqa: E731
        wait_until(lambda: failed() >= 1, True)
        assert failed() >= 1
        for kind in ("inline", "manifest"):
            assert metric(learner, "livefit_weights_published_total", model="demo", kind=kind) == 0
        assert metric(learner, "livefit_published_version", model="demo") == 0
        # each failure is counted after its refusal, in the same thread, and the snapshots keep
        # publishing: read the failures first, then the refusals, or a failure counted between
        # the two reads looks like one without a refusal (CI on 2026-11-27: 2 refused, 3 failed)
        failures = failed()
        refused = metric(learner, "livefit_broker_publish_refused_total", topic=topic,
                         reason="over_max_packet_size")  # fmt: skip
        assert refused >= failures
        assert httpx.get(f"{learner.url}/v2/health/ready", timeout=5).status_code == 200
    finally:
        assert learner.stop() == 0
    log = learner.log.read_text()
    assert log.count("not published: even as a manifest") == 1, log[-3000:]
    assert "replicas get no weights" in log
    assert "published (manifest" not in log and "published (inline" not in log
