"""A process that knows three facts (the broker, the model's name, the learner's public key)
predicts like the learner: real mosquitto, a real ``livefit serve``, the subscriber in a fresh
Python process.

Two models whose networks a subscriber could not guess: a binary classifier (an MLP with relu
units, input scaling, a sigmoid output for ``binary_crossentropy``: before descriptions every
snapshot was refused as ``wrong_architecture`` unless the caller repeated scaling and loss),
served by the NumPy runtime, and an LSTM with target scaling, served by the Keras graph. At the
learner's final version, the subscriber's outputs are the learner's HTTP answers to 1e-6. The
same version's safetensors and JSON description, read by NumPy alone (TensorFlow and livefit
made unimportable), give those answers too. A learner restarted with another network on the
same topic and key is followed: the subscriber builds the new network instead of refusing it.
Each kept version exports to ONNX on request (cached), and onnxruntime answers as the learner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from livefit.clients.publisher import SamplePublisher
from livefit.clients.weights import WeightSubscriber
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.format import open_envelope, sha256_hex
from livefit.server.weights.keys import SigningKey
from tests.configs import learner_config, model

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(8)
ROWS = {"clf": RNG.normal(size=(5, 6)).round(3).tolist(),
        "seq": RNG.normal(size=(4, 3, 2)).round(3).tolist()}  # fmt: skip
THREE_FACTS = """
import json, sys
from livefit.clients.weights import WeightSubscriber
where, name, key, wanted, rows = sys.argv[1:6]
source = {"broker_url": where} if where.startswith("mqtt") else {"pull_url": where}
with WeightSubscriber(model_name=name, verify_key=key, **source) as weights:
    weights.wait_for_version(int(wanted), timeout=60)
    outputs, version = weights.predict_with_version(json.loads(rows))
print(json.dumps({"version": version, "outputs": outputs.tolist()}))
"""


def models(key_file: Path, clf_hidden: str = "[12, 7]", activation: str = "relu",
           weights: str = "") -> str:  # fmt: skip
    """The two models; ``weights``: their weights table (default: signed with ``key_file``)."""
    weights = weights or f'signing_key_file = "{key_file}"\npublish_interval_s = 0.2'
    clf = model("clf", builder="mlp", input_shape=(6,), lines=(
        f'loss = "binary_crossentropy"\nseed = 3\n'
        f'builder_options = {{ hidden_units = {clf_hidden}, activation = "{activation}" }}'
    ), weights=weights)  # fmt: skip
    seq = model("seq", builder="lstm", input_shape=(3, 2), output_shape=(2,),
                lines="seed = 4\nbuilder_options = { units = 4 }", weights=weights)  # fmt: skip
    return clf + seq


@pytest.fixture(scope="module")
def signing(tmp_path_factory: pytest.TempPathFactory) -> tuple[SigningKey, Path]:
    key = SigningKey.generate()
    path = tmp_path_factory.mktemp("key") / "weights.key"
    path.write_bytes(key.private_pem())
    return key, path


@pytest.fixture(scope="module")
def learner(
    broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory, signing: tuple[SigningKey, Path]
) -> Iterator[LivefitProcess]:
    workdir = tmp_path_factory.mktemp("subscriber")
    text = learner_config(broker, workdir / "data", f"subscriber-{broker.port}", models(signing[1]))
    process = LivefitProcess(text, workdir).start()
    try:
        train(broker, process, 400, seed=1)
        yield process
    finally:
        assert process.stop() in (0, None)


def train(broker: Mosquitto, learner: LivefitProcess, count: int, seed: int) -> dict[str, int]:
    """Publish ``count`` samples to each model; their versions once all are trained and
    published."""
    rng = np.random.default_rng(seed)
    x_clf = rng.normal(size=(count, 6)).astype(np.float32)
    y_clf = (x_clf[:, :1] - x_clf[:, 1:2] > 0).astype(np.float32)
    x_seq = rng.normal(size=(count, 3, 2)).astype(np.float32)
    y_seq = np.stack([x_seq.sum(axis=(1, 2)) * 10 + 50, x_seq[:, -1, 0] * 3], axis=1)
    before = {name: learner.metric("livefit_train_samples_total", model=name)
              for name in ("clf", "seq")}  # fmt: skip
    for name, x, y in (("clf", x_clf, y_clf), ("seq", x_seq, y_seq)):
        with SamplePublisher(learner_broker(learner), f"livefit/{name}/samples") as publisher:
            for start in range(0, count, 50):
                publisher.publish(x[start : start + 50], y[start : start + 50], batched=True)
    return {name: settle(learner, name, before[name] + count) for name in ("clf", "seq")}


def learner_broker(learner: LivefitProcess) -> str:
    text = Path(learner.config).read_text()
    return text.split('url = "', 1)[1].split('"', 1)[0]


def settle(learner: LivefitProcess, name: str, trained: float) -> int:
    deadline = time.monotonic() + 90
    while learner.metric("livefit_train_samples_total", model=name) < trained:
        assert time.monotonic() < deadline, f"{name}: not every sample was trained"
        time.sleep(0.1)
    while time.monotonic() < deadline:
        version = learner.metric("livefit_model_version", model=name)
        if learner.metric("livefit_published_version", model=name) == version:
            return int(version)
        time.sleep(0.05)
    raise AssertionError(f"{name}: the learner did not publish its newest version")


def answers(server: LivefitProcess, name: str) -> tuple[np.ndarray, int]:
    response = httpx.post(f"{server.url}/v1/models/{name}:predict",
                          json={"instances": ROWS[name]}, timeout=10)  # fmt: skip
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["predictions"]), int(response.json()["model_version"])


@pytest.mark.parametrize(("name", "over"), [("clf", "mqtt"), ("seq", "mqtt"), ("clf", "http")])
def test_a_fresh_process_with_three_facts_predicts_like_the_learner(
    learner: LivefitProcess, broker: Mosquitto, signing: tuple[SigningKey, Path], name: str,
    over: str,
) -> None:  # fmt: skip
    """The three facts: the broker (or, ``http``, the learner's URL), the name and the key."""
    version = int(learner.metric("livefit_published_version", model=name))
    assert version > 0
    where = broker.url if over == "mqtt" else learner.url
    result = subprocess.run(
        [sys.executable, "-c", THREE_FACTS, where, name, signing[0].public.base64(),
         str(version), json.dumps(ROWS[name])],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    expected, served_version = answers(learner, name)
    assert got["version"] == served_version == version
    np.testing.assert_allclose(got["outputs"], expected, rtol=0, atol=1e-6)
    if name == "clf":
        assert ((expected > 0) & (expected < 1)).all()  # the sigmoid travelled with the weights


@pytest.mark.parametrize("name", ["clf", "seq"])
def test_numpy_alone_reads_safetensors_and_description(
    learner: LivefitProcess, tmp_path: Path, name: str
) -> None:
    """``examples/numpy_reader.py`` with TensorFlow, Keras and livefit unimportable."""
    poison = tmp_path / "poison"
    poison.mkdir()
    for module in ("tensorflow", "keras", "livefit", "safetensors"):
        (poison / f"{module}.py").write_text(f"raise ImportError('{module} must not be needed')")
    env = {**os.environ, "PYTHONPATH": str(poison)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "numpy_reader.py"), learner.url, name,
         json.dumps(ROWS[name])],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    expected, version = answers(learner, name)
    assert got["version"] == version
    np.testing.assert_allclose(got["outputs"], expected, rtol=1e-5, atol=1e-6)


def test_the_description_is_the_one_the_learner_signed(
    learner: LivefitProcess, broker: Mosquitto
) -> None:
    response = httpx.get(f"{learner.url}/v1/models/clf/description", timeout=10)
    assert response.status_code == 200
    doc = response.json()
    version = int(response.headers["x-model-version"])
    assert (doc["model"], doc["version"]) == ("clf", version)
    described = doc["description"]
    assert described["input"]["shape"] == [6] and described["output"]["activation"] == "sigmoid"
    # the default model: the network and the linear expert, mixed (models/experts.py)
    assert [step["kind"] for step in described["layers"]] == ["standardize", "mixture"]
    mixture = described["layers"][1]
    assert [[step["kind"] for step in expert] for expert in mixture["experts"]] == [
        ["dense", "dense", "dense"], ["dense"]]  # fmt: skip
    assert mixture["share"].endswith("experts/share")
    weights = httpx.get(f"{learner.url}/v1/models/clf/weights?version={version}", timeout=10)
    assert doc["weights_sha256"] == sha256_hex(weights.content)
    text = response.text.split('"description":', 1)[1][:-1]
    retained = open_envelope(_retained(broker, "livefit/clf/weights")).header
    assert retained.description_sha256 == sha256_hex(text.encode())
    assert httpx.get(f"{learner.url}/v1/models/nope/description", timeout=10).status_code == 404


def _retained(broker: Mosquitto, topic: str) -> bytes:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    got: list[bytes] = []
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.on_message = lambda _c, _u, message: got.append(bytes(message.payload))
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        client.disconnect()
        client.loop_stop()
    assert got, f"no retained message on {topic}"
    return got[0]


@pytest.mark.parametrize("name", ["clf", "seq"])
def test_a_kept_version_exports_to_onnx_once(learner: LivefitProcess, name: str) -> None:
    """onnxruntime, given the learner's export of a version, answers as the learner does at
    that version; the second request is the cached file."""
    import onnxruntime

    version = int(learner.metric("livefit_published_version", model=name))
    url = f"{learner.url}/v1/models/{name}/export/onnx?version={version}"
    first = httpx.get(url, timeout=120)
    assert first.status_code == 200, first.text
    again = httpx.get(url, timeout=120)
    assert (first.headers["x-export-cache"], again.headers["x-export-cache"]) == ("miss", "hit")
    assert again.content == first.content and first.headers["x-model-version"] == str(version)
    print(f"{name}: ONNX export {first.headers['x-export-seconds']} s, {len(first.content)} bytes")
    session = onnxruntime.InferenceSession(first.content)
    rows = np.asarray(ROWS[name], dtype=np.float32)
    (got,) = session.run(None, {session.get_inputs()[0].name: rows})
    expected, served = answers(learner, name)
    assert served == version
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert httpx.get(f"{learner.url}/v1/models/{name}/export/pickle").status_code == 404


def test_a_replica_configured_with_another_activation_says_so(
    learner: LivefitProcess, broker: Mosquitto, signing: tuple[SigningKey, Path], tmp_path: Path
) -> None:
    """Same weight shapes (the fingerprint matches), another function: the replica serves its
    own config's network, as before, and warns once for ``clf``; ``seq``, configured as the
    learner's, matches its description and draws no warning."""
    weights = f'verify_key = "{signing[0].public.base64()}"'
    text = learner_config(broker, tmp_path / "data", f"replica-{broker.port}",
                          models(signing[1], activation="tanh", weights=weights))  # fmt: skip
    replica = LivefitProcess(text, tmp_path, command="replica").start()
    try:
        for name in ("clf", "seq"):
            version = learner.metric("livefit_published_version", model=name)
            assert replica.wait_for_metric("livefit_serving_version", version, model=name,
                                           timeout=30) == version  # fmt: skip
        lines = [line for line in replica.log.read_text().splitlines()
                 if "network differs from the one this config builds" in line]  # fmt: skip
        assert len(lines) == 1 and "model clf" in lines[0], lines
    finally:
        assert replica.stop() == 0


def test_a_learner_restarted_with_another_network_is_followed(
    learner: LivefitProcess, broker: Mosquitto, signing: tuple[SigningKey, Path], tmp_path: Path
) -> None:
    """Runs last in this file: it stops the module's learner. The new learner (fresh storage:
    a new lineage; the same key and topic) has another classifier; the subscriber, given only
    the three facts, rebuilds and answers as the new learner does."""
    subscriber = WeightSubscriber(broker.url, "clf", verify_key=signing[0].public.base64())
    subscriber.start()
    second: LivefitProcess | None = None
    try:
        version = int(learner.metric("livefit_published_version", model="clf"))
        subscriber.wait_for_version(version, timeout=30)
        first_model = subscriber.model
        assert learner.stop() == 0
        text = learner_config(broker, tmp_path / "data", f"second-{broker.port}",
                              models(signing[1], clf_hidden="[5]"))  # fmt: skip
        second = LivefitProcess(text, tmp_path).start()
        versions = train(broker, second, 200, seed=2)
        subscriber.wait_for(lambda s: s.outcomes.get("new_lineage") == 1
                            and s.version == versions["clf"], timeout=30)  # fmt: skip
        outputs, version = subscriber.predict_with_version(ROWS["clf"])
        expected, served = answers(second, "clf")
        assert version == served == versions["clf"]
        np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-6)
        assert subscriber.model is not first_model
        assert subscriber.outcomes.get("wrong_architecture", 0) == 0
        assert subscriber.outcomes.get("bad_description", 0) == 0
    finally:
        subscriber.stop()
        if second is not None:
            assert second.stop() == 0
