"""The weight stream end to end: a learner, replicas and a WeightSubscriber as real processes.

One learner and two replicas share a config with no key settings at all: the learner makes
its Ed25519 key in the storage dir on first start and the replicas find its public key there.
After training, both replicas serve the learner's newest version within 2 s and answer with
the same numbers; a replica started late is ready with the retained weights; forged (a
snapshot at version 10**9, unsigned or signed by another key), corrupted and foreign weights
are refused and counted while the replica keeps serving, and the learner's next snapshot is
still taken; a WeightSubscriber in a plain Python process, given its own model, follows the
learner; a replica with no key refuses to start. Over MQTT 3.1.1, a replica and a WeightSubscriber follow a learner
restarted with new storage (a new lineage) and refuse the old lineage's snapshot replayed.

The large-model test (a manifest, then a pull from the learner's HTTP) runs against both
layouts (``tests/layouts.py``): in the split learner the weights are
served by a serving process that got them over the local feed, not by the process that
published the manifest; a ``WeightSubscriber`` with no broker, polling the learner's and the
replica's HTTP, verifies what each serves with the learner's key and predicts like the learner. The other tests run once: the weight topic, its key and its
signatures are the training process's, which is the one-process learner's code
(``LearnerRuntime``), and replicas, forged weights and ``WeightSubscriber`` do not see which
layout published them; the split learner's serving processes are checked to serve the training
process's version in ``test_learner_group.py``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.clients.weights import WeightSubscriber
from livefit.local_servers import LivefitProcess
from livefit.models.builders import build_model
from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.format import open_envelope, sha256_hex
from livefit.server.weights.keys import (
    SigningKey,
    default_key_path,
    default_public_path,
    parse_signing_key,
)
from tests.configs import SMALL_MLP, learner_config, model
from tests.layouts import in_both_layouts, metric, with_layout
from tests.weight_envelopes import Weights, forged

TOPIC = "livefit/demo/weights"
ROWS = np.random.default_rng(3).normal(size=(5, 8)).round(3).tolist()


def config(broker: Mosquitto, storage: Path, extra: str = "", head: str = "") -> str:
    """The small MLP; ``extra`` ends its weights table, ``head`` its broker table."""
    client_id = f"weights-{broker.port}-{storage.parent.name}-{storage.name}"
    demo = model(builder="mlp", lines=SMALL_MLP, weights=f"publish_interval_s = 0.2\n{extra}")
    return learner_config(broker, storage, client_id, demo, broker_lines=head)


def publish_samples(broker: Mosquitto, count: int, seed: int = 0, topic: str = "") -> None:
    stream = LinearStream(input_dim=8, seed=seed)
    with SamplePublisher(broker.url, topic or "livefit/demo/samples", fmt="msgpack") as publisher:
        for _ in range(count // 50):
            x, y = stream.sample(50)
            publisher.publish(x, y, batched=True)


def settle(learner: LivefitProcess, trained: int) -> int:
    """Wait until the learner (either layout) trained ``trained`` samples and published its
    final version."""
    deadline = time.monotonic() + 60
    while metric(learner, "livefit_train_samples_total", model="demo") < trained:
        assert time.monotonic() < deadline, "the learner did not train every sample"
        time.sleep(0.1)
    assert metric(learner, "livefit_train_samples_total", model="demo") == trained
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        version = metric(learner, "livefit_model_version", model="demo")
        if metric(learner, "livefit_published_version", model="demo") == version:
            return int(version)
        time.sleep(0.05)
    raise AssertionError("learner did not publish its latest version")


def serving_version(server: LivefitProcess) -> int:
    return int(server.metric("livefit_serving_version", model="demo"))


def wait_serving(server: LivefitProcess, version: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while serving_version(server) != version and time.monotonic() < deadline:
        time.sleep(0.05)
    return serving_version(server)


def outcome(server: LivefitProcess, name: str) -> float:
    return server.metric("livefit_weights_received_total", model="demo", outcome=name)


def lineage_of(server: LivefitProcess, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{server.url}/v1/models/demo/weights", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.headers["x-weights-lineage"]


def wait_published(learner: LivefitProcess, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{learner.url}/v1/models/demo/weights", timeout=5).status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("the learner published no weights")


def predict(server: LivefitProcess) -> tuple[list[list[float]], str]:
    response = httpx.post(
        f"{server.url}/v1/models/demo:predict", json={"instances": ROWS}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()["predictions"], response.json()["model_version"]


class Mqtt:
    """A plain paho client (MQTT 5 or 3.1.1) for publishing and catching retained messages."""

    def __init__(self, broker: Mosquitto, protocol: int = paho.MQTTv5) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=protocol)
        self.messages: list[bytes] = []
        self.client.on_message = lambda _c, _u, message: self.messages.append(message.payload)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def retained(self, topic: str, timeout: float = 5) -> bytes:
        self.messages.clear()
        self.client.subscribe(topic, qos=1)
        deadline = time.monotonic() + timeout
        while not self.messages and time.monotonic() < deadline:
            time.sleep(0.02)
        self.client.unsubscribe(topic)
        assert self.messages, f"no retained message on {topic}"
        return bytes(self.messages[0])

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture(scope="module")
def cluster(
    broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LivefitProcess]]:
    workdir = tmp_path_factory.mktemp("weights")
    text = config(broker, workdir / "data")
    learner = LivefitProcess(text, workdir).start()
    replicas = [LivefitProcess(text, workdir, command="replica") for _ in range(2)]
    try:
        for replica in replicas:
            replica.start()
        yield {"learner": learner, "a": replicas[0], "b": replicas[1], "workdir": workdir}  # type: ignore[dict-item]
    finally:
        for replica in replicas:
            replica.stop()
        assert learner.stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield


def test_replicas_follow_the_learner_and_agree(
    cluster: dict[str, LivefitProcess], broker: Mosquitto
) -> None:
    learner, a, b = cluster["learner"], cluster["a"], cluster["b"]
    publish_samples(broker, 2000)
    latest = settle(learner, 2000)
    assert latest > 0
    started = time.monotonic()
    while min(serving_version(a), serving_version(b)) < latest and time.monotonic() - started < 30:
        time.sleep(0.02)
    lag = time.monotonic() - started
    assert serving_version(a) == serving_version(b) == latest
    # How fast is the freshness benchmark's figure; here only an order of magnitude, as two
    # replicas and the learner share 2 loaded cores
    assert lag < 10.0, f"replicas took {lag:.2f}s to serve v{latest}"
    outputs = [predict(server) for server in (learner, a, b)]
    assert {version for _, version in outputs} == {str(latest)}
    np.testing.assert_allclose(outputs[1][0], outputs[0][0], rtol=1e-6)
    np.testing.assert_allclose(outputs[2][0], outputs[0][0], rtol=1e-6)
    assert outcome(a, "accepted") >= 1
    assert a.metric("livefit_freshness_seconds_count", model="demo", stage="served") >= 1
    assert learner.metric("livefit_freshness_seconds_count", model="demo", stage="published") >= 1
    assert lineage_of(a) == lineage_of(b) == lineage_of(learner)
    for replica in (a, b):  # the learner describes the network their shared config builds
        assert "network differs" not in replica.log.read_text()


def test_learner_made_its_key_and_logged_the_public_key(cluster: dict[str, LivefitProcess]) -> None:
    storage = Path(str(cluster["workdir"])) / "data"
    key = parse_signing_key(default_key_path(storage).read_bytes())
    assert default_key_path(storage).stat().st_mode & 0o777 == 0o600
    assert default_public_path(storage).is_file()
    log = cluster["learner"].log.read_text()
    assert key.public.base64() in log and str(default_key_path(storage)) in log
    assert "verified with Ed25519 key " + key.key_id in cluster["a"].log.read_text()


def test_weights_download_endpoint(cluster: dict[str, LivefitProcess]) -> None:
    learner = cluster["learner"]
    response = httpx.get(f"{learner.url}/v1/models/demo/weights", timeout=10)
    assert response.status_code == 200
    assert response.headers["x-weights-sha256"] == sha256_hex(response.content)
    assert int(response.headers["x-model-version"]) >= 0
    assert len(response.headers["x-weights-lineage"]) == 32
    assert httpx.get(f"{learner.url}/v1/models/demo/weights?version=999999").status_code == 404
    assert httpx.get(f"{learner.url}/v1/models/nope/weights").status_code == 404


def test_late_replica_is_ready_with_retained_weights(cluster: dict[str, LivefitProcess]) -> None:
    learner = cluster["learner"]
    late = LivefitProcess(learner.config.read_text(), cluster["workdir"], command="replica")  # type: ignore[arg-type]
    started = time.monotonic()
    late.start()
    try:
        published = int(learner.metric("livefit_published_version", model="demo"))
        assert wait_serving(late, published) == published  # the gauge follows the swap
        assert predict(late)[1] == predict(learner)[1]
        assert time.monotonic() - started < 60
    finally:
        assert late.stop() == 0


def test_forged_weights_are_refused_and_the_next_real_ones_taken(
    cluster: dict[str, LivefitProcess], broker: Mosquitto
) -> None:
    """Forged snapshots (version 10**9: unsigned, signed by another key, tampered after signing)
    and validly signed but wrong ones are refused and counted; the replica keeps serving, and
    takes the learner's next real snapshot."""
    learner, replica = cluster["learner"], cluster["a"]
    storage = Path(str(cluster["workdir"])) / "data"
    learner_key = parse_signing_key(default_key_path(storage).read_bytes())
    before_version = serving_version(replica)
    before_outputs = predict(replica)
    weights = Weights.of("mlp", {"hidden_units": [16]}, experts=True)  # the learner's defaults
    mqtt = Mqtt(broker)
    try:
        for expected, message in forged(weights, learner_key, TOPIC):
            count = outcome(replica, expected)
            mqtt.publish(TOPIC, message)
            seen = replica.wait_for_metric("livefit_weights_received_total", count + 1, timeout=10,
                                           model="demo", outcome=expected)  # fmt: skip
            assert seen == count + 1, expected
    finally:
        mqtt.close()
    assert serving_version(replica) == before_version
    assert predict(replica) == before_outputs
    trained = int(learner.metric("livefit_train_samples_total", model="demo"))
    publish_samples(broker, 200, seed=9)
    latest = settle(learner, trained + 200)  # counted before publishing: no race with training
    assert latest > before_version
    assert wait_serving(replica, latest) == latest


SUBSCRIBER_SCRIPT = """
import json, sys
from livefit.clients.weights import WeightSubscriber
from livefit.models.builders import build_model
broker, key, rows, wanted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
model = build_model("mlp", [8], [1], {"hidden_units": [16]}, seed=99, scaling="standardize")
with WeightSubscriber(broker, "demo", verify_key=key, model=model) as weights:
    ok = weights.wait_for_version(wanted, timeout=60) == wanted
    out = weights.predict(rows).tolist()
    print(json.dumps({"ok": ok, "version": weights.version, "outputs": out,
                      "outcomes": weights.outcomes}))
"""


def test_weight_subscriber_in_a_plain_process(
    cluster: dict[str, LivefitProcess], broker: Mosquitto
) -> None:
    learner = cluster["learner"]
    trained = int(learner.metric("livefit_train_samples_total", model="demo"))
    publish_samples(broker, 500, seed=5)
    latest = settle(learner, trained + 500)
    public = default_public_path(Path(str(cluster["workdir"])) / "data")
    result = subprocess.run(
        [sys.executable, "-c", SUBSCRIBER_SCRIPT, broker.url, str(public), json.dumps(ROWS),
         str(latest)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["ok"] and answer["version"] == latest, answer
    outputs, version = predict(learner)
    assert version == str(latest)
    np.testing.assert_allclose(answer["outputs"], outputs, rtol=1e-5)


@in_both_layouts()
def test_large_model_goes_through_manifest_and_http_pull(
    broker: Mosquitto, tmp_path: Path, layout: str
) -> None:
    """Manifest, then a pull from the configured learner URL, with the bearer token. What the
    learner's HTTP serves for a version is the payload its manifest signed (same sha256), in
    the same lineage; a split learner's serving process too, though it encoded the snapshot
    apart and may get it after the manifest went out."""
    topic, token = "large/weights", "pull-token-5"
    extra = f'max_inline_bytes = 1024\ntopic = "{topic}"'
    head = f'[http]\ntoken = "{token}"'
    text = config(broker, tmp_path / "data", extra=extra, head=head)
    text = text.replace("[models.demo]", '[models.demo]\ntopic = "large/samples"')
    learner = LivefitProcess(with_layout(text, layout), tmp_path).start()
    replica = LivefitProcess(text + f'pull_url = "{learner.url}"\n', tmp_path, command="replica")
    mqtt = Mqtt(broker)
    try:
        replica.start()
        with SamplePublisher(broker.url, "large/samples", fmt="msgpack") as publisher:
            x, y = LinearStream(input_dim=8, seed=2).sample(500)
            publisher.publish(x, y, batched=True)
        latest = settle(learner, 500)
        published = metric(learner, "livefit_weights_published_total", model="demo",
                           kind="manifest")  # fmt: skip
        assert published >= 1
        assert metric(learner, "livefit_weights_payload_bytes", model="demo") > 1024
        assert wait_serving(replica, latest) == latest
        assert predict(replica) == predict(learner)
        assert outcome(replica, "pull_failed") == 0
        signed = open_envelope(mqtt.retained(topic)).header
        assert (signed.kind, signed.version) == ("manifest", latest)
        served = httpx.get(f"{learner.url}/v1/models/demo/weights?version={latest}",
                           headers={"Authorization": f"Bearer {token}"}, timeout=10)  # fmt: skip
        assert served.headers["x-weights-sha256"] == sha256_hex(served.content) == signed.sha256
        assert lineage_of(replica, token) == lineage_of(learner, token) == signed.lineage
        key = default_public_path(tmp_path / "data").read_text()
        for origin in (learner, replica):  # no broker: the URL, the token and the key
            with WeightSubscriber(model_name="demo", pull_url=origin.url, pull_token=token,
                                  verify_key=key, topic=topic) as polled:  # fmt: skip
                polled.wait_for_version(latest, timeout=30)
                outputs, version = polled.predict_with_version(ROWS)
            np.testing.assert_allclose(outputs, predict(learner)[0], rtol=0, atol=1e-6)
            assert version == latest and polled.outcomes == {"accepted": 1}
    finally:
        mqtt.close()
        replica.stop()
        assert learner.stop() == 0


def test_replica_without_a_key_does_not_start(broker: Mosquitto, tmp_path: Path) -> None:
    """No verify key, no allow_unsigned: a config error naming the settings, before the replica
    connects anywhere (a listener in place of the broker sees no connection)."""
    with socket.socket() as fake_broker:
        fake_broker.bind(("127.0.0.1", 0))
        fake_broker.listen()
        fake_broker.setblocking(False)
        port = fake_broker.getsockname()[1]
        path = tmp_path / "replica.toml"
        text = config(broker, tmp_path / "empty", head="connect_timeout_s = 1")
        path.write_text(text.replace(broker.url, f"mqtt://127.0.0.1:{port}"))
        result = subprocess.run(
            [sys.executable, "-m", "livefit", "replica", "--config", str(path), "--port",
             str(free_port())],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        with pytest.raises(BlockingIOError):
            fake_broker.accept()
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "models.demo.weights.verify_key" in output and "allow_unsigned" in output


def test_new_lineage_over_mqtt_311(broker: Mosquitto, tmp_path: Path) -> None:
    """Learner A publishes; it stops and learner B starts with fresh storage (same key, same
    topic): the replica and a WeightSubscriber, all over MQTT 3.1.1, follow B and count
    ``new_lineage``; A's snapshot re-published as retained is refused as a rollback."""
    signing = SigningKey.generate()
    key_file = tmp_path / "weights.key"
    key_file.write_bytes(signing.private_pem())
    topic = "lineage/weights"
    extra = (
        f'topic = "{topic}"\nsigning_key_file = "{key_file}"\n'
        f'verify_key = "{signing.public.base64()}"'
    )

    def text(storage: str) -> str:
        base = config(broker, tmp_path / storage, extra=extra)
        base = base.replace("[models.demo]", '[models.demo]\ntopic = "lineage/samples"')
        return base.replace(f'url = "{broker.url}"', f'url = "{broker.url}"\nprotocol = "3.1.1"')

    learner_a = LivefitProcess(text("a"), tmp_path / "a").start()
    replica = LivefitProcess(text("replica"), tmp_path / "replica", command="replica")
    learner_b: LivefitProcess | None = None
    model = build_model("mlp", [8], [1], {"hidden_units": [16]}, seed=1, scaling="standardize")
    subscriber = WeightSubscriber(broker.url, "demo", model=model, topic=topic, protocol="3.1.1",
                                  verify_key=signing.public.base64())  # fmt: skip
    mqtt = Mqtt(broker, protocol=paho.MQTTv311)
    try:
        replica.start()
        subscriber.start()
        publish_samples(broker, 500, topic="lineage/samples")
        latest_a = settle(learner_a, 500)
        assert wait_serving(replica, latest_a) == latest_a
        assert subscriber.wait_for_version(latest_a, timeout=10) == subscriber.version == latest_a
        lineage_a = lineage_of(learner_a)
        old_a = mqtt.retained(topic)
        assert learner_a.stop() == 0

        learner_b = LivefitProcess(text("b"), tmp_path / "b").start()
        wait_published(learner_b)
        lineage_b = lineage_of(learner_b)
        assert lineage_b != lineage_a
        version_b = int(learner_b.metric("livefit_published_version", model="demo"))
        assert version_b < latest_a, "a fresh learner starts again at 0"
        assert replica.wait_for_metric("livefit_weights_received_total", 1, timeout=10,
                                       model="demo", outcome="new_lineage") == 1  # fmt: skip
        assert wait_serving(replica, version_b) == version_b
        assert lineage_of(replica) == lineage_b
        assert subscriber.wait_for(lambda s: s.lineage == lineage_b, timeout=10)
        assert subscriber.outcomes.get("new_lineage") == 1 and subscriber.version == version_b

        mqtt.publish(topic, old_a, retain=True)  # an old, validly signed snapshot replayed
        assert replica.wait_for_metric("livefit_weights_received_total", 1, timeout=10,
                                       model="demo", outcome="rollback") == 1  # fmt: skip
        assert subscriber.wait_for(lambda s: s.outcomes.get("rollback") == 1, timeout=10)
        assert serving_version(replica) == version_b and lineage_of(replica) == lineage_b
        assert subscriber.lineage == lineage_b

        publish_samples(broker, 200, seed=4, topic="lineage/samples")
        latest_b = settle(learner_b, 200)
        assert wait_serving(replica, latest_b) == latest_b
        assert subscriber.wait_for_version(latest_b, timeout=10) == latest_b
        assert "new lineage" in replica.log.read_text()
    finally:
        mqtt.close()
        subscriber.stop()
        replica.stop()
        learner_a.stop()
        if learner_b is not None:
            assert learner_b.stop() == 0
