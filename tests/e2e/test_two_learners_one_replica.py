"""One replica following two learners (docs/fleet.md), as real processes on a real mosquitto.

Learner 1 owns model ``alpha``, learner 2 model ``beta``: each its own storage dir, HTTP token
and Ed25519 key (made with ``python -m livefit.server.weights.keys``, as the docs say), both
the same ``broker.client_id`` prefix (a learner's ids are per model). Both publish manifests only (``max_inline_bytes = 1024``), so every snapshot the replica
serves was pulled over HTTP from its own learner with that learner's token
(``weights.pull_url`` and ``weights.pull_token``, per model). The replica verifies ``alpha``
with learner 1's public key only and ``beta`` with learner 2's only.

Checked: while learner 2 has not started the replica is not ready and says that ``beta`` waits
(and nothing about ``alpha``); then it serves both models at both learners' versions with the
learners' own numbers, lists both in ``/v2/models`` and ``/metrics``; labels and prediction
records of a model reach its learner only; a snapshot for ``alpha`` signed with learner 2's
real key is refused and counted; a second learner claiming ``alpha`` on the same broker is
logged and counted by both learners and never followed by the replica; learner 2 stopping and
restarting leaves ``alpha`` served throughout, and ``beta`` at its last version until learner
2 is back. No process loses its MQTT session to another.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import free_port, stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.format import decode_weights
from livefit.server.weights.keys import (
    default_public_path,
    parse_signing_key,
    parse_verify_key,
    read_key_file,
)
from tests.configs import learner_config, model
from tests.layouts import metric
from tests.weight_envelopes import Weights, envelope

TOKENS = {"alpha": "token-of-learner-1", "beta": "token-of-learner-2"}
INPUTS = {"alpha": 8, "beta": 4}
ROWS = {name: np.random.default_rng(5).normal(size=(3, dim)).round(3).tolist()
        for name, dim in INPUTS.items()}  # fmt: skip


def model_table(name: str, weights: str) -> str:
    """The model both sides describe alike (a replica builds what its learner trains)."""
    hidden = 64 if name == "alpha" else 48  # over 1 KiB of weights: manifests, pulled
    lines = f"builder_options = {{ hidden_units = [{hidden}] }}\nlearning_rate = 0.01\nseed = 11"
    return model(name, builder="mlp", input_shape=(INPUTS[name],), lines=lines, weights=weights)


def learner_text(broker: Mosquitto, storage: Path, name: str, client_id: str, key: str) -> str:
    signing = f'signing_key_file = "{key}"\n' if key else ""  # none: made in storage/keys
    weights = f"publish_interval_s = 0.2\nmax_inline_bytes = 1024\n{signing}"
    return learner_config(broker, storage, client_id, model_table(name, weights),
                          broker_lines=f'[http]\ntoken = "{TOKENS[name]}"')  # fmt: skip


def make_key(directory: Path) -> tuple[Path, Path]:
    """A signing key and its public key, made by the key command the docs give."""
    private, public = directory / "weights.key", directory / "weights.pub"
    done = subprocess.run(
        [sys.executable, "-m", "livefit.server.weights.keys", str(private), str(public)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return private, public


def key_id(public: Path) -> str:
    return parse_verify_key(read_key_file(public)).key_id


@dataclass
class Waiting:
    """What the replica answered while alpha was served and beta's learner not started."""

    status: int  # /v2/health/ready
    problems: list[str]
    ready: dict[str, int]  # /v2/models/<name>/ready
    alpha_predict: int  # POST /v1/models/alpha:predict


@dataclass
class Fleet:
    broker: Mosquitto
    workdir: Path
    learners: dict[str, LivefitProcess]  # by the model each owns
    replica: LivefitProcess
    keys: dict[str, tuple[Path, Path]]
    waiting_for_beta: Waiting  # the replica before learner 2 started
    started_at: float


@pytest.fixture(scope="module")
def fleet(broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    keys = {name: make_key(workdir / f"keys-{name}") for name in TOKENS}
    ports = {name: free_port() for name in TOKENS}
    learners = {}
    for n, name in enumerate(TOKENS, start=1):
        # One client id prefix for both: a learner's ids are per model (<prefix>-<model>).
        client_id, storage = f"fleet-learner-{broker.port}", workdir / f"data-{n}"
        text = learner_text(broker, storage, name, client_id, str(keys[name][0]))
        learners[name] = LivefitProcess(text, workdir, name=f"learner-{n}", port=ports[name])
    # The replica: alpha's key as a file, beta's as the base64 a learner logs.
    beta_key = parse_verify_key(read_key_file(keys["beta"][1])).base64()
    verify = {
        "alpha": f'verify_key_file = "{keys["alpha"][1]}"',
        "beta": f'verify_key = "{beta_key}"',
    }
    replica_models = [
        model_table(name, f'{verify[name]}\npull_url = "{learners[name].url}"\n'
                          f'pull_token = "{TOKENS[name]}"\npull_timeout_s = 20')
        for name in TOKENS
    ]  # fmt: skip
    replica = LivefitProcess(
        learner_config(broker, workdir / "data-replica", f"fleet-replica-{broker.port}",
                       *replica_models),
        workdir, command="replica", name="replica",
    )  # fmt: skip
    started_at = time.time()
    try:
        learners["alpha"].start(ready_timeout_s=None)
        replica.start(ready_timeout_s=None)
        learners["alpha"].wait_ready(180)
        waiting = wait_until_only_beta_waits(replica)
        learners["beta"].start(ready_timeout_s=180)
        replica.wait_ready(120)
        yield Fleet(broker, workdir, learners, replica, keys, waiting, started_at)
    finally:
        stop_all([replica, *learners.values()])
        clear_retained(broker, [f"livefit/{name}/weights" for name in TOKENS])


def wait_until_only_beta_waits(replica: LivefitProcess) -> Waiting:
    """The replica's answers once alpha's weights arrived, before beta's learner started."""
    deadline = time.monotonic() + 180
    status, problems = 0, ["(no answer yet)"]
    while time.monotonic() < deadline:
        replica.fail_if_exited()
        try:
            response = httpx.get(f"{replica.url}/v2/health/ready", timeout=5)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        status, problems = response.status_code, response.json().get("problems", [])
        if status == 200 or not any("alpha" in p for p in problems):
            ready = {name: httpx.get(f"{replica.url}/v2/models/{name}/ready", timeout=5).status_code
                     for name in TOKENS}  # fmt: skip
            alpha = httpx.post(f"{replica.url}/v1/models/alpha:predict",
                               json={"instances": ROWS["alpha"]}, timeout=30)  # fmt: skip
            return Waiting(status, problems, ready, alpha.status_code)
        time.sleep(0.2)
    raise AssertionError(f"alpha never arrived at the replica: {problems}")


def clear_retained(broker: Mosquitto, topics: list[str]) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        for topic in topics:
            client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()


def publish_samples(broker: Mosquitto, name: str, count: int, seed: int) -> None:
    stream = LinearStream(input_dim=INPUTS[name], seed=seed)
    with SamplePublisher(broker.url, f"livefit/{name}/samples", fmt="msgpack") as publisher:
        for _ in range(count // 50):
            x, y = stream.sample(50)
            publisher.publish(x, y, batched=True)


def train(fleet: Fleet, name: str, count: int, seed: int) -> int:
    """Send ``count`` samples of ``name``; its learner's version once all are trained and
    that version is published."""
    learner = fleet.learners[name]
    trained = metric(learner, "livefit_train_samples_total", model=name)
    publish_samples(fleet.broker, name, count, seed)
    wait_for(lambda: metric(learner, "livefit_train_samples_total", model=name),
             trained + count, f"{name}: samples trained", 120)  # fmt: skip

    def published() -> bool:
        version = metric(learner, "livefit_model_version", model=name)
        return metric(learner, "livefit_published_version", model=name) == version

    wait_for(lambda: float(published()), 1, f"{name}: newest version published")
    return int(metric(learner, "livefit_model_version", model=name))


def wait_for(read: Callable[[], float], at_least: float, what: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    value = read()
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    assert value >= at_least, f"{what}: {value} after {timeout:.0f} s, wanted {at_least}"
    return value


def served_version(fleet: Fleet, name: str) -> int:
    return int(fleet.replica.metric("livefit_serving_version", model=name))


def wait_served(fleet: Fleet, name: str, version: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while served_version(fleet, name) != version and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served_version(fleet, name) == version, fleet.replica.tail()


def predict(server: LivefitProcess, name: str, ids: list[str] | None = None) -> httpx.Response:
    body: dict[str, object] = {"instances": ROWS[name]}
    if ids is not None:
        body["ids"] = ids
    response = httpx.post(f"{server.url}/v1/models/{name}:predict", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


def received(fleet: Fleet, name: str, outcome: str) -> float:
    return fleet.replica.metric("livefit_weights_received_total", model=name, outcome=outcome)


def models_in(server: LivefitProcess) -> set[str]:
    """Every ``model`` label value in ``server``'s /metrics."""
    return {value for (_, labels), _ in server.metrics().items() for key, value in labels
            if key == "model"}  # fmt: skip


def lineage(server: LivefitProcess, name: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{server.url}/v1/models/{name}/weights", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.headers["x-weights-lineage"]


def test_readiness_names_the_model_whose_learner_has_not_started(fleet: Fleet) -> None:
    """Not ready, saying which model waits; the model that has weights is served meanwhile."""
    waiting = fleet.waiting_for_beta
    problems = waiting.problems
    assert waiting.status == 503, problems
    assert problems and all("model beta" in p for p in problems), problems
    assert any("no weights yet on livefit/beta/weights" in p for p in problems), problems
    assert waiting.ready == {"alpha": 200, "beta": 503}
    assert waiting.alpha_predict == 200


def test_the_replica_serves_each_learners_model_at_its_version(fleet: Fleet) -> None:
    versions = {name: train(fleet, name, 300, seed) for seed, name in enumerate(TOKENS)}
    for name, version in versions.items():
        wait_served(fleet, name, version)
        learner, replica = predict(fleet.learners[name], name), predict(fleet.replica, name)
        assert replica.json()["model_version"] == str(version)
        assert learner.json()["model_version"] == str(version)
        np.testing.assert_allclose(replica.json()["predictions"],
                                   learner.json()["predictions"], rtol=1e-5, atol=1e-6)  # fmt: skip
        # Pulled: the learner published manifests only, and the replica refused nothing.
        published = fleet.learners[name].metrics()
        assert published[("livefit_weights_published_total",
                          (("kind", "manifest"), ("model", name)))] >= 1  # fmt: skip
        assert published.get(("livefit_weights_published_total",
                              (("kind", "inline"), ("model", name))), 0) == 0  # fmt: skip
        assert received(fleet, name, "pull_failed") == 0
        assert received(fleet, name, "accepted") >= 1
        # Each learner's token is its own: the other one's does not open its weights.
        other = TOKENS["beta" if name == "alpha" else "alpha"]
        refused = httpx.get(f"{fleet.learners[name].url}/v1/models/{name}/weights",
                            headers={"Authorization": f"Bearer {other}"}, timeout=10)  # fmt: skip
        assert refused.status_code == 401
        assert lineage(fleet.replica, name) == lineage(fleet.learners[name], name, TOKENS[name])
    listing = httpx.get(f"{fleet.replica.url}/v2/models", timeout=10).json()
    assert listing == {"models": [{"name": name, "version": str(versions[name]), "ready": True}
                                  for name in sorted(TOKENS)]}  # fmt: skip
    assert httpx.get(f"{fleet.replica.url}/v2/health/ready", timeout=10).status_code == 200
    assert models_in(fleet.replica) == {"alpha", "beta"}
    assert models_in(fleet.learners["alpha"]) == {"alpha"}
    assert models_in(fleet.learners["beta"]) == {"beta"}


def test_labels_and_prediction_records_reach_only_their_models_learner(fleet: Fleet) -> None:
    for name in TOKENS:
        joined = metric(fleet.learners[name], "livefit_labels_total", model=name, outcome="joined")
        predict(fleet.replica, name, ids=[f"{name}-{joined:.0f}-{row}" for row in range(3)])
        label = httpx.post(f"{fleet.replica.url}/v1/models/{name}/labels",
                           json={"id": f"{name}-{joined:.0f}-0", "y": [0.5]}, timeout=30)  # fmt: skip
        assert label.status_code == 202, label.text
        wait_for(lambda n=name: metric(fleet.learners[n], "livefit_labels_total", model=n,  # type: ignore[misc]
                                       outcome="joined"), joined + 1, f"{name}: label joined")  # fmt: skip
        wait_for(lambda n=name: metric(fleet.learners[n], "livefit_pending_predictions",  # type: ignore[misc]
                                       model=n), 1, f"{name}: the unlabelled record waits")  # fmt: skip
    for name, other in (("alpha", "beta"), ("beta", "alpha")):
        assert other not in models_in(fleet.learners[name]), "a model's labels reached a stranger"
    sent = fleet.replica.metric("livefit_prediction_records_total", model="alpha", outcome="sent")
    assert sent >= 3


def test_a_snapshot_signed_with_the_other_learners_key_is_refused(fleet: Fleet) -> None:
    """alpha's real weights and lineage, a newer version, signed with learner 2's real key:
    only the key is wrong, and the replica refuses it and keeps serving learner 1's."""
    learner = fleet.learners["alpha"]
    served = served_version(fleet, "alpha")
    response = httpx.get(f"{learner.url}/v1/models/alpha/weights",
                         headers={"Authorization": f"Bearer {TOKENS['alpha']}"}, timeout=10)  # fmt: skip
    names, arrays, meta = decode_weights(response.content)
    learner_2_key = parse_signing_key(read_key_file(fleet.keys["beta"][0]))
    forged = envelope(learner_2_key, Weights(names, arrays), topic="livefit/alpha/weights",
                      model="alpha", version=served + 10**6, lineage=meta.lineage)  # fmt: skip
    refused_before = received(fleet, "alpha", "bad_signature")
    foreign_before = metric(learner, "livefit_weights_foreign_total", model="alpha")
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", fleet.broker.port)
    client.loop_start()
    try:
        client.publish("livefit/alpha/weights", forged, qos=1).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()
    wait_for(lambda: received(fleet, "alpha", "bad_signature"), refused_before + 1,
             "replica: alpha signed by learner 2 refused")  # fmt: skip
    wait_for(lambda: metric(learner, "livefit_weights_foreign_total", model="alpha"),
             foreign_before + 1, "learner 1: the foreign snapshot counted")  # fmt: skip
    assert served_version(fleet, "alpha") < served + 10**6
    assert received(fleet, "beta", "bad_signature") == 0


def test_a_second_learner_claiming_a_model_is_logged_counted_and_not_followed(
    fleet: Fleet,
) -> None:
    learner = fleet.learners["alpha"]
    foreign_before = metric(learner, "livefit_weights_foreign_total", model="alpha")
    refused_before = received(fleet, "alpha", "bad_signature")
    storage = fleet.workdir / "data-intruder"
    intruder = LivefitProcess(
        learner_text(fleet.broker, storage, "alpha", f"fleet-intruder-{fleet.broker.port}", ""),
        fleet.workdir, name="intruder",
    )  # fmt: skip
    try:
        intruder.start(ready_timeout_s=180)
        wait_for(lambda: metric(learner, "livefit_weights_foreign_total", model="alpha"),
                 foreign_before + 1, "learner 1 saw the intruder's weights")  # fmt: skip
        wait_for(lambda: metric(intruder, "livefit_weights_foreign_total", model="alpha"), 1,
                 "the intruder saw learner 1's weights")  # fmt: skip
        wait_for(lambda: received(fleet, "alpha", "bad_signature"), refused_before + 1,
                 "replica refused the intruder's weights")  # fmt: skip
        intruder_key = key_id(default_public_path(storage))
        wait_for(lambda: float(bool(foreign_lines(intruder, "ERROR"))), 1,
                 "the intruder's ERROR line (learner 1 publishing now)")  # fmt: skip
    finally:
        intruder.stop()
    # The intruder found learner 1's retained snapshot at subscribe (a WARNING: that learner
    # could be long gone), then saw it published again while it runs (an ERROR); each line
    # names both keys. Learner 1's ERROR may have gone to an earlier foreign message (the
    # forged one above): such lines come at most once a minute.
    own_key = key_id(fleet.keys["alpha"][1])
    for level, said in (("WARNING", "the retained message found at subscribe"),
                        ("ERROR", "a message on its own weight topic")):  # fmt: skip
        line = foreign_lines(intruder, level)[0]
        assert said in line and "Another learner of this model on the broker" in line
        assert f"key id {intruder_key}" in line and f"it says key id {own_key}" in line
    assert foreign_lines(learner, "ERROR"), learner.tail()
    # The replica never served the intruder: it still serves learner 1's lineage and version.
    assert lineage(fleet.replica, "alpha") == lineage(learner, "alpha", TOKENS["alpha"])
    assert received(fleet, "alpha", "new_lineage") == 0
    version = int(metric(learner, "livefit_published_version", model="alpha"))
    wait_served(fleet, "alpha", version)


def test_one_learner_restarting_leaves_the_other_model_served(fleet: Fleet) -> None:
    beta_version = train(fleet, "beta", 100, seed=7)  # trained, so its stop checkpoints it
    wait_served(fleet, "beta", beta_version)
    beta_lineage = lineage(fleet.replica, "beta")
    old = fleet.learners["beta"]
    assert old.stop() == 0
    # Learner 2 is gone: beta keeps its last version, alpha keeps learning and serving.
    assert httpx.get(f"{fleet.replica.url}/v2/health/ready", timeout=10).status_code == 200
    assert predict(fleet.replica, "beta").json()["model_version"] == str(beta_version)
    alpha_version = train(fleet, "alpha", 100, seed=8)
    wait_served(fleet, "alpha", alpha_version)
    assert predict(fleet.replica, "alpha").json()["model_version"] == str(alpha_version)
    again = LivefitProcess(old.config, fleet.workdir, name="learner-2-again", port=old.port)
    fleet.learners["beta"] = again
    answered = []
    again.start(ready_timeout_s=None)
    # The replica answers alpha all the while learner 2 starts. Asked before each readiness
    # check: a learner that listens at once (forked, tests/forkserver.py) holds the first check
    # until it is ready, and with the check first nothing was asked in such a start.
    while True:
        again.fail_if_exited()
        answered.append(predict(fleet.replica, "alpha").status_code)
        if _ready(again):
            break
        time.sleep(0.2)
    print(f"alpha answered {len(answered)} times while learner 2 started")
    assert answered and set(answered) == {200}
    newer = train(fleet, "beta", 100, seed=9)
    assert newer > beta_version
    wait_served(fleet, "beta", newer)
    assert lineage(fleet.replica, "beta") == beta_lineage  # restarted from its checkpoint
    assert received(fleet, "beta", "new_lineage") == 0


def foreign_lines(learner: LivefitProcess, level: str) -> list[str]:
    """``learner``'s log lines at ``level`` about a foreign message on its weight topic."""
    return [line for line in learner.log.read_text(errors="replace").splitlines()
            if f" {level} " in line and "is not this learner's" in line]  # fmt: skip


def _ready(server: LivefitProcess) -> bool:
    try:
        return httpx.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_no_process_lost_its_session_to_another(fleet: Fleet) -> None:
    """Learners sharing one ``broker.client_id`` prefix, the replica's weight receivers (one per
    model) and its recorders each have an id of their own: no learner says its session was
    taken over, and mosquitto closed no fleet session for a newer one with the same id. (The
    broker's log is buffered: it proves nothing about the ids it has not written yet.)"""
    for learner in fleet.learners.values():
        assert "taken over" not in learner.log.read_text(errors="replace"), learner.tail()
        assert _ready(learner)
    assert _ready(fleet.replica)
    broker_log = (fleet.broker.workdir / "mosquitto.log").read_text(errors="replace")
    taken_over = [line for line in broker_log.splitlines()
                  if "already connected" in line and "fleet-" in line]  # fmt: skip
    assert taken_over == []


def test_the_replica_logs_each_models_key_and_origin_never_a_token(fleet: Fleet) -> None:
    text = fleet.replica.log.read_text(errors="replace")
    for name in TOKENS:
        said = [line for line in text.splitlines() if f"weights of {name} are verified" in line]
        assert said, fleet.replica.tail()
        assert f"Ed25519 key {key_id(fleet.keys[name][1])}" in said[0]
        assert f"pulled from {fleet.learners[name].url}" in said[0]
        assert f"models.{name}.weights.pull_token" in said[0]
    for token in TOKENS.values():
        assert token not in text
