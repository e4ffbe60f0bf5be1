"""The weight stream end to end: a learner, replicas and a WeightSubscriber as real processes.

One learner and two replicas share a config (with an HMAC key). After training, both replicas
serve the learner's newest version within 2 s and answer with the same numbers; a replica
started late is ready with the retained weights; forged, corrupted and foreign weights are
refused and counted while the replica keeps serving; a WeightSubscriber in a plain Python
process follows the learner.
"""

from __future__ import annotations

import json
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
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from livefit.clients.publish import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.models import build_model, weight_names
from livefit.server.weight_format import (
    WEIGHTS_CONTENT_TYPE,
    WeightsMeta,
    architecture_fingerprint,
    encode_weights,
    sha256_hex,
    sign,
)
from tests.mqtt_broker import MosquittoBroker
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e
KEY = "test-secret-key"
TOPIC = "livefit/demo/weights"
ROWS = np.random.default_rng(3).normal(size=(5, 8)).round(3).tolist()


def config(broker: MosquittoBroker, storage: Path, extra: str = "") -> str:
    return f"""
[broker]
url = "{broker.url}"
client_id = "weights-{broker.port}"
[storage]
dir = "{storage}"
[models.demo]
builder = "mlp"
builder_options = {{ hidden_units = [16] }}
input_shape = [8]
output_shape = [1]
learning_rate = 0.01
seed = 11
[models.demo.weights]
hmac_key = "{KEY}"
publish_interval_s = 0.2
{extra}
"""


def publish_samples(broker: MosquittoBroker, count: int, seed: int = 0) -> None:
    stream = LinearStream(input_dim=8, seed=seed)
    with SamplePublisher(broker.url, "livefit/demo/samples", fmt="msgpack") as publisher:
        for _ in range(count // 50):
            x, y = stream.sample(50)
            publisher.publish(x, y, batched=True)


def settle(learner: ServerProcess, trained: int) -> int:
    """Wait until the learner trained ``trained`` samples and published its final version."""
    assert learner.wait_for_metric("livefit_train_samples_total", trained, model="demo") == trained
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        version = learner.metric("livefit_model_version", model="demo")
        if learner.metric("livefit_published_version", model="demo") == version:
            return int(version)
        time.sleep(0.05)
    raise AssertionError("learner did not publish its latest version")


def serving_version(server: ServerProcess) -> int:
    return int(server.metric("livefit_serving_version", model="demo"))


def predict(server: ServerProcess) -> tuple[list[list[float]], str]:
    response = httpx.post(
        f"{server.url}/v1/models/demo:predict", json={"instances": ROWS}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()["predictions"], response.json()["model_version"]


@pytest.fixture(scope="module")
def cluster(
    broker: MosquittoBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    workdir = tmp_path_factory.mktemp("weights")
    text = config(broker, workdir / "data")
    learner = ServerProcess(text, workdir).start()
    replicas = [ServerProcess(text, workdir, command="replica") for _ in range(2)]
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
    cluster: dict[str, ServerProcess], broker: MosquittoBroker
) -> None:
    learner, a, b = cluster["learner"], cluster["a"], cluster["b"]
    publish_samples(broker, 2000)
    latest = settle(learner, 2000)
    assert latest > 0
    started = time.monotonic()
    while min(serving_version(a), serving_version(b)) < latest and time.monotonic() - started < 5:
        time.sleep(0.02)
    lag = time.monotonic() - started
    assert serving_version(a) == serving_version(b) == latest
    assert lag < 2.0, f"replicas took {lag:.2f}s to serve v{latest}"
    outputs = [predict(server) for server in (learner, a, b)]
    assert {version for _, version in outputs} == {str(latest)}
    np.testing.assert_allclose(outputs[1][0], outputs[0][0], rtol=1e-6)
    np.testing.assert_allclose(outputs[2][0], outputs[0][0], rtol=1e-6)
    assert a.metric("livefit_weights_received_total", model="demo", outcome="accepted") >= 1
    assert a.metric("livefit_freshness_seconds_count", model="demo") >= 1
    assert learner.metric("livefit_freshness_seconds_count", model="demo") >= 1


def test_weights_download_endpoint(cluster: dict[str, ServerProcess]) -> None:
    learner = cluster["learner"]
    response = httpx.get(f"{learner.url}/v1/models/demo/weights", timeout=10)
    assert response.status_code == 200
    assert response.headers["x-weights-sha256"] == sha256_hex(response.content)
    assert int(response.headers["x-model-version"]) >= 0
    assert httpx.get(f"{learner.url}/v1/models/demo/weights?version=999999").status_code == 404
    assert httpx.get(f"{learner.url}/v1/models/nope/weights").status_code == 404


def test_late_replica_is_ready_with_retained_weights(cluster: dict[str, ServerProcess]) -> None:
    learner = cluster["learner"]
    late = ServerProcess(learner.config.read_text(), cluster["workdir"], command="replica")  # type: ignore[arg-type]
    started = time.monotonic()
    late.start()
    try:
        assert serving_version(late) == learner.metric("livefit_published_version", model="demo")
        assert predict(late)[1] == predict(learner)[1]
        assert time.monotonic() - started < 60
    finally:
        assert late.stop() == 0


def forged_messages() -> list[tuple[str, bytes, list[tuple[str, str]]]]:
    """(expected outcome, payload, user properties) for each kind of bad weights message."""
    model = build_model("mlp", [8], [1], {"hidden_units": [16]}, seed=1, scaling="standardize")
    names, arrays = weight_names(model), model.get_weights()
    meta = WeightsMeta("demo", 10**9, 0, time.time(), None, architecture_fingerprint(names, arrays))
    good = encode_weights(names, arrays, meta)
    other = build_model("mlp", [8], [1], {"hidden_units": [4]}, seed=1, scaling="standardize")
    other_names, other_arrays = weight_names(other), other.get_weights()
    foreign = encode_weights(other_names, other_arrays, WeightsMeta(
        "demo", 10**9, 0, time.time(), None, architecture_fingerprint(other_names, other_arrays)))  # fmt: skip
    wrong_model = encode_weights(
        names, arrays, WeightsMeta("other", 10**9, 0, time.time(), None, meta.fingerprint)
    )
    nan_arrays = [np.full_like(a, np.nan) for a in arrays]
    non_finite = encode_weights(names, nan_arrays, meta)

    def props(payload: bytes, key: str | None = KEY) -> list[tuple[str, str]]:
        signed = [("hmac", sign(key.encode(), TOPIC, payload))] if key else []
        return [("sha256", sha256_hex(payload)), *signed]

    return [
        ("unsigned", good, props(good, key=None)),
        ("bad_hmac", good, props(good, key="not-the-key")),
        ("bad_sha256", good, [("sha256", "0" * 64), ("hmac", sign(KEY.encode(), TOPIC, good))]),
        ("bad_payload", b"corrupted" * 10, props(b"corrupted" * 10)),
        ("wrong_architecture", foreign, props(foreign)),
        ("wrong_model", wrong_model, props(wrong_model)),
        ("non_finite", non_finite, props(non_finite)),
    ]


def test_bad_weights_are_refused_and_counted(
    cluster: dict[str, ServerProcess], broker: MosquittoBroker
) -> None:
    replica = cluster["a"]
    before_version = serving_version(replica)
    before_outputs = predict(replica)
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        for outcome, payload, user_properties in forged_messages():
            count = replica.metric("livefit_weights_received_total", model="demo", outcome=outcome)
            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType = WEIGHTS_CONTENT_TYPE
            properties.UserProperty = user_properties
            client.publish(TOPIC, payload, qos=1, properties=properties).wait_for_publish(5)
            seen = replica.wait_for_metric("livefit_weights_received_total", count + 1, timeout=10,
                                           model="demo", outcome=outcome)  # fmt: skip
            assert seen == count + 1, outcome
    finally:
        client.disconnect()
        client.loop_stop()
    assert serving_version(replica) == before_version
    assert predict(replica) == before_outputs


SUBSCRIBER_SCRIPT = """
import json, sys
from livefit.clients.weights import WeightSubscriber
from livefit.models import build_model
broker, key, rows, wanted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
model = build_model("mlp", [8], [1], {"hidden_units": [16]}, seed=99, scaling="standardize")
with WeightSubscriber(model, broker, "demo", hmac_key=key) as weights:
    ok = weights.wait_for_version(wanted, timeout=60)
    out = weights.predict(rows).tolist()
    print(json.dumps({"ok": ok, "version": weights.version, "outputs": out}))
"""


def test_weight_subscriber_in_a_plain_process(
    cluster: dict[str, ServerProcess], broker: MosquittoBroker
) -> None:
    learner = cluster["learner"]
    publish_samples(broker, 500, seed=5)
    latest = settle(learner, 2500)
    result = subprocess.run(
        [sys.executable, "-c", SUBSCRIBER_SCRIPT, broker.url, KEY, json.dumps(ROWS), str(latest)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["ok"] and answer["version"] == latest
    outputs, version = predict(learner)
    assert version == str(latest)
    np.testing.assert_allclose(answer["outputs"], outputs, rtol=1e-5)


def test_large_model_goes_through_manifest_and_http_pull(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    text = (
        config(broker, tmp_path / "data", extra="max_inline_bytes = 1024")
        .replace(
            f'client_id = "weights-{broker.port}"', f'client_id = "weights-large-{broker.port}"'
        )
        .replace("[models.demo]", '[models.demo]\ntopic = "large/samples"')
    )
    text = text.replace("[models.demo.weights]", '[models.demo.weights]\ntopic = "large/weights"')
    learner = ServerProcess(text, tmp_path).start()
    replica = ServerProcess(text, tmp_path, command="replica")
    try:
        replica.start()
        with SamplePublisher(broker.url, "large/samples", fmt="msgpack") as publisher:
            x, y = LinearStream(input_dim=8, seed=2).sample(500)
            publisher.publish(x, y, batched=True)
        latest = settle(learner, 500)
        assert learner.metric("livefit_weights_published_total", model="demo", kind="manifest") >= 1
        assert learner.metric("livefit_weights_payload_bytes", model="demo") > 1024
        deadline = time.monotonic() + 10
        while serving_version(replica) < latest and time.monotonic() < deadline:
            time.sleep(0.05)
        assert serving_version(replica) == latest
        assert predict(replica) == predict(learner)
    finally:
        replica.stop()
        assert learner.stop() == 0
