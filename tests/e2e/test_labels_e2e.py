"""Delayed labels end to end: a real mosquitto, a real learner and replica, real Keras.

One learner serves three linear models: ``joins`` (long TTL) for joins, ``drop`` and ``dflt``
(3 s TTL, at most 5 pending; expired predictions dropped, or learned with the default label).
A replica beside it records its own predictions. Checked: ids in both protocols are echoed
(duplicates are a 400); predictions served by the learner and by the replica are joined at the
learner with labels sent over MQTT and over HTTP, in both orders; expiry by count and by TTL
under both policies; hostile labels are dead-lettered and acknowledged; `livefit publish
--label-delay` streams predictions and later labels; and, last, a learner
killed with SIGKILL holding pending predictions and early labels joins them after its restart,
each once.

The join test runs against both layouts (``tests/layouts.py``; the split learner in a fleet of
its own): there the learner's predictions are recorded by a serving process and
joined by the training process, over the broker like a replica's. The others run once: ids,
expiry, hostile labels and the restart are the joiner's and the ingestion's, in the training
process the one-process learner's code (``LearnerRuntime``); a serving process records
predictions and forwards HTTP labels with the replica's code, which the replica here runs.
"""

from __future__ import annotations

import contextlib
import json
import signal
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

from livefit.clients.predict import PredictClient
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.keys import default_public_path
from livefit.server.wire.labels import encode_predictions
from tests import configs
from tests.layouts import LAYOUT_IDS, LAYOUTS, ONE_PROCESS, metric, with_layout

ROW = [0.5, -1.0]


def labelled(name: str, labels: str) -> str:
    """A 2-input linear model whose labels arrive apart from its features."""
    return configs.model(
        name, input_shape=[2], lines="seed = 3", weights="publish_interval_s = 0.2",
        checkpoint="interval_s = 0.5", labels=f"tick_s = 0.2\n{labels}",
    )  # fmt: skip


def config(broker: Mosquitto, storage: Path) -> str:
    return configs.learner_config(
        broker, storage, f"labels-{broker.port}",
        labelled("joins", "ttl_s = 3600"),
        # ttl_s: long enough for a label to follow its record on a loaded host, short enough
        # for the expiry to be waited for
        labelled("drop", "ttl_s = 6\nmax_pending = 5"),
        labelled("dflt", 'ttl_s = 6\nmax_pending = 5\non_expiry = "default"\ndefault_y = 0.25'),
    )  # fmt: skip


Fleet = tuple[Mosquitto, LivefitProcess, LivefitProcess, str]


@contextlib.contextmanager
def running_fleet(workdir: Path, layout: str) -> Iterator[Fleet]:
    """A broker, the learner (``layout``), a replica, and the learner's config."""
    broker = Mosquitto(workdir / "mosquitto")
    broker.start()
    text = config(broker, workdir / "data")
    learner = LivefitProcess(with_layout(text, layout), workdir)
    replica = LivefitProcess(text, workdir, command="replica")
    try:  # side by side: the replica waits for its weights while the learner gets ready
        learner.start(ready_timeout_s=None)
        # A replica waits broker.connect_timeout_s (10 s) for the key of a learner sharing its
        # storage, which a learner writes after its imports: a loaded host took longer
        key, deadline = default_public_path(workdir / "data"), time.monotonic() + 120
        while not key.is_file():
            assert time.monotonic() < deadline and learner.alive(), learner.tail()
            time.sleep(0.05)
        replica.start(ready_timeout_s=None)
        learner.wait_ready()
        replica.wait_ready()
        yield broker, learner, replica, with_layout(text, layout)
    finally:
        stop_all([learner, replica])
        broker.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The one-process learner's fleet, which the module's tests share in order."""
    with running_fleet(tmp_path_factory.mktemp("labels"), ONE_PROCESS) as running:
        yield running


@pytest.fixture(params=LAYOUTS, ids=LAYOUT_IDS)
def fleet_of_each_layout(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """``fleet`` for the one-process learner; for the split one, a fleet of its own."""
    if request.param == ONE_PROCESS:
        yield request.getfixturevalue("fleet")
        return
    with running_fleet(tmp_path_factory.mktemp("labels-split"), request.param) as running:
        yield running


def outcome(server: LivefitProcess, model: str, name: str) -> float:
    return metric(server, "livefit_labels_total", model=model, outcome=name)


def wait_for(read, value: float, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    current = read()
    while current < value and time.monotonic() < deadline:
        time.sleep(0.1)
        current = read()
    return current


def settle(read, value: float, timeout: float = 10.0) -> float:
    """``read()`` once it equals ``value`` (a gauge that may still fall or rise to it), or the
    last value read after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (current := read()) != value and time.monotonic() < deadline:
        time.sleep(0.1)
    return current


def steady(read, quiet_s: float = 1.0, timeout: float = 10.0) -> float:
    """``read()`` once it has not changed for ``quiet_s`` (records in flight have landed:
    they take milliseconds), or the last value read after ``timeout``."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        current = read()
        if current != value:
            value, since = current, time.monotonic()
    return value


def publish(broker: Mosquitto, topic: str, payloads: list[bytes]) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        for info in [client.publish(topic, p, qos=1) for p in payloads]:
            info.wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def test_ids_are_echoed_in_both_protocols_and_checked(fleet) -> None:
    _, learner, _, _ = fleet
    tf = httpx.post(
        f"{learner.url}/v1/models/joins:predict", json={"instances": [ROW, ROW], "ids": ["a", 7]}
    )
    assert tf.status_code == 200 and tf.json()["ids"] == ["a", 7]
    body = {
        "inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": ROW}],
        "parameters": {"ids": ["v2-a"]},
    }
    v2 = httpx.post(f"{learner.url}/v2/models/joins/infer", json=body)
    assert v2.status_code == 200 and v2.json()["parameters"] == {"ids": ["v2-a"]}
    for ids, message in (
        (["x", "x"], "repeats an id"),
        (["x"], "one id per row"),
        ([1.5, 2], "string or an integer"),
    ):
        bad = httpx.post(
            f"{learner.url}/v1/models/joins:predict", json={"instances": [ROW, ROW], "ids": ids}
        )
        assert bad.status_code == 400 and message in bad.json()["error"], bad.text
    plain = httpx.post(f"{learner.url}/v1/models/joins:predict", json={"instances": [ROW]})
    assert "ids" not in plain.json()


def test_learner_and_replica_predictions_join_in_both_orders(fleet_of_each_layout) -> None:
    broker, learner, replica, _ = fleet_of_each_layout
    joined = outcome(learner, "joins", "joined")
    trained = metric(learner, "livefit_train_samples_total", model="joins")
    # an earlier test's predictions with ids may still be on their way to the learner
    pending = steady(lambda: metric(learner, "livefit_pending_predictions", model="joins"))
    labels = steady(lambda: metric(learner, "livefit_pending_labels", model="joins"))
    with PredictClient(learner.url) as on_learner, PredictClient(replica.url, protocol="v2") as r:
        assert on_learner.predict("joins", [ROW] * 3, ids=["l1", "l2", "l3"]).ids == [
            "l1", "l2", "l3",
        ]  # fmt: skip
        assert r.predict("joins", [ROW] * 2, ids=["r1", 42]).ids == ["r1", 42]
        # all five recorded before their labels are sent (the order this test is about)
        wait_for(lambda: metric(learner, "livefit_pending_predictions", model="joins"), pending + 5)
        # labels after their predictions: over MQTT (one, and a batch) and over HTTP (replica)
        publish(broker, "livefit/joins/labels", [b'{"id": "l1", "y": [1.0]}'])
        publish(
            broker,
            "livefit/joins/labels",
            [json.dumps({"id": ["l2", 42], "y": [[2], [3]]}).encode()],
        )
        r.label("joins", "r1", [4.0])
        # a label before its prediction: waits, then joins when the prediction comes
        on_learner.labels("joins", ["early"], [[5.0]])
        wait_for(lambda: metric(learner, "livefit_pending_labels", model="joins"), labels + 1)
        on_learner.predict("joins", [ROW], ids=["early"])
        # and a label for an id already joined
        on_learner.label("joins", "l1", [9.0])
    assert wait_for(lambda: outcome(learner, "joins", "joined"), joined + 5) == joined + 5
    assert wait_for(lambda: outcome(learner, "joins", "duplicate"), 1) == 1
    assert wait_for(
        lambda: metric(learner, "livefit_train_samples_total", model="joins"), trained + 5
    ) == trained + 5  # fmt: skip
    # "l3" alone stays pending; the gauge follows the joins a moment later (its owner's tick)
    assert (
        settle(lambda: metric(learner, "livefit_pending_predictions", model="joins"), pending + 1)
        == pending + 1
    )
    assert (
        metric(learner, "livefit_served_score", model="joins", metric="mae", window="sliding") > 0
    )
    assert metric(learner, "livefit_label_delay_seconds_count", model="joins") >= 5
    assert replica.metric("livefit_prediction_records_total", model="joins", outcome="sent") == 2


@pytest.mark.parametrize("name", ["drop", "dflt"])
def test_expiry_by_count_and_by_ttl(fleet, name: str) -> None:
    _, learner, _, _ = fleet
    trained = metric(learner, "livefit_train_samples_total", model=name)
    with PredictClient(learner.url) as client:
        client.predict(name, [ROW] * 7, ids=[f"{name}-{i}" for i in range(7)])
        assert wait_for(lambda: outcome(learner, name, "expired"), 2) == 2  # max_pending = 5
        client.labels(name, [f"{name}-0", f"{name}-6"], [[1.0], [1.0]])  # expired, pending
    assert wait_for(lambda: outcome(learner, name, "joined"), 1) == 1
    assert wait_for(lambda: outcome(learner, name, "expired"), 6, timeout=30) == 6  # ttl_s = 6
    assert outcome(learner, name, "late") == 1
    learned = 1 + (6 if name == "dflt" else 0)  # the join, and the default labels
    assert wait_for(
        lambda: metric(learner, "livefit_train_samples_total", model=name), trained + learned
    ) == trained + learned  # fmt: skip
    assert metric(learner, "livefit_pending_predictions", model=name) == 0


def test_bad_labels_are_dead_lettered_and_acknowledged(fleet) -> None:
    broker, learner, _, _ = fleet
    reports: list[dict] = []
    listener = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    listener.on_message = lambda client, userdata, m: reports.append(json.loads(m.payload))
    listener.connect("127.0.0.1", broker.port)
    listener.subscribe("livefit/joins/rejected", qos=1)
    listener.loop_start()
    bad = [
        b"\xc1garbage",
        b'{"id": "a"}',
        b'{"id": ["a", "a"], "y": [[1], [2]]}',
        b'{"id": "a", "y": [1, 2, 3]}',
        b'{"id": {"x": 1}, "y": [1]}',
        b'{"ids": [1], "x": [[0, 0]], "p": [[0]], "version": [-1], "t": [0]}',  # predictions
    ]
    before = outcome(learner, "joins", "rejected")
    try:
        time.sleep(0.3)  # the subscription is in place
        publish(broker, "livefit/joins/labels", bad[:-1])
        publish(broker, "livefit/joins/predictions", bad[-1:])
        assert wait_for(lambda: outcome(learner, "joins", "rejected"), before + 5) == before + 5
        deadline = time.monotonic() + 10
        while len(reports) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        listener.disconnect()
        listener.loop_stop()
    assert sorted(r["reason"] for r in reports) == [
        "bad_schema", "bad_schema", "bad_schema", "bad_schema", "bad_shape", "undecodable",
    ]  # fmt: skip
    http = httpx.post(f"{learner.url}/v1/models/joins/labels", json={"id": "a", "y": [1, 2]})
    assert http.status_code == 400 and http.json()["error"].startswith("bad_shape")


def test_publish_streams_predictions_now_and_labels_later(fleet) -> None:
    """`livefit publish --label-delay`, predicting through the replica."""
    broker, learner, replica, _ = fleet
    joined = outcome(learner, "joins", "joined")
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "publish", "--broker", broker.url, "--model", "joins",
         "--input-shape", "2", "--count", "60", "--batch", "5", "--label-delay", "10",
         "--label-delay-random", "--server", replica.url, "--no-progress", "--no-check"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "predicted 60 samples" in done.stdout and "published 60 labels" in done.stdout
    assert wait_for(lambda: outcome(learner, "joins", "joined"), joined + 60) == joined + 60


def test_restart_keeps_pending_predictions_and_early_labels(fleet) -> None:
    """SIGKILL with a checkpoint holding pending state and more in the log after it."""
    _, learner, _, text = fleet
    with PredictClient(learner.url) as client:
        client.predict("joins", [ROW] * 4, ids=["k0", "k1", "k2", "k3"])
        client.labels("joins", ["k0"], [[1.0]])  # trains: a checkpoint with k1-k3 pending
        time.sleep(1.5)
        client.predict("joins", [ROW] * 2, ids=["k4", "k5"])  # in the log after it
        client.labels("joins", ["e0", "e1"], [[1.0], [2.0]])  # early labels
        assert wait_for(lambda: metric(learner, "livefit_pending_labels", model="joins"), 2) == 2
    pending = metric(learner, "livefit_pending_predictions", model="joins")
    joined = outcome(learner, "joins", "joined")
    learner.stop(signal.SIGKILL)
    again = LivefitProcess(text, learner.workdir).start()
    try:
        assert metric(again, "livefit_pending_predictions", model="joins") == pending
        assert metric(again, "livefit_pending_labels", model="joins") == 2
        with PredictClient(again.url) as client:
            client.labels("joins", ["k0", "k1", "k2", "k3", "k4", "k5"], [[1.0]] * 6)
            client.predict("joins", [ROW] * 2, ids=["e0", "e1"])
        assert wait_for(lambda: outcome(again, "joins", "joined"), 7) == 7  # k1-k5, e0, e1
        assert outcome(again, "joins", "duplicate") == 1  # k0, joined before the kill
        assert joined >= 1
    finally:
        assert again.stop() == 0


def test_predictions_with_ids_never_wait_for_a_frozen_broker(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    """README: recording never blocks a prediction. With the broker frozen (SIGSTOP), 300
    predictions with ids all answer (a wait on the broker would never end); every recorded row is
    counted as sent (queued for the broker) or dropped, and after SIGCONT the records that
    were kept reach the learner as pending predictions."""
    text = config(own_broker, tmp_path / "data").replace(
        "[models.joins.labels]\ntick_s = 0.2\nttl_s = 3600",
        "[models.joins.labels]\ntick_s = 0.2\nttl_s = 3600\nrecord_buffer_rows = 100",
    )
    learner = LivefitProcess(text, tmp_path).start()
    assert own_broker.process is not None
    try:
        with PredictClient(learner.url) as client:
            client.predict("joins", [ROW], ids=["warm"])  # the recorder's session is up
            own_broker.process.send_signal(signal.SIGSTOP)
            for i in range(300):  # the broker stays frozen until all 300 are answered
                assert client.predict("joins", [ROW], ids=[f"f{i}"]) is not None
        # The recorder's thread counts a row as sent or dropped a moment after its answer.
        # Both counts only grow and a row joins one of them, so a sum of 301 means both are final.
        deadline = time.monotonic() + 10.0
        while True:
            sent, dropped = (
                metric(learner, "livefit_prediction_records_total", model="joins", outcome=o)
                for o in ("sent", "dropped")
            )
            if sent + dropped >= 301 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sent + dropped == 301, (sent, dropped)
        own_broker.process.send_signal(signal.SIGCONT)
        pending = wait_for(
            lambda: metric(learner, "livefit_pending_predictions", model="joins"), sent
        )
        assert pending == sent, (pending, sent, dropped)
    finally:
        if own_broker.process is not None and own_broker.process.poll() is None:
            own_broker.process.send_signal(signal.SIGCONT)
        assert learner.stop() == 0


# The smallest round count of 256-byte ids (the documented maximum; 2 inputs, default
# labels.max_pending) whose saved state broke the old checkpoints: the state was a base64 note
# in the safetensors header, capped at 100,000,000 bytes; 260,000 made a 93.7 MB note, 280,000
# a 100.7 MB one (100,000 pending predictions and 180,000 remembered expired ids).
LONG_IDS = 280_000


def test_long_ids_checkpoint_and_restore(tmp_path: Path, own_broker: Mosquitto) -> None:
    """Issue 26 item 3: at 280,000 predictions with 256-byte ids every checkpoint failed with
    ``SafetensorError: header too large`` while readiness and ``livefit_storage_healthy`` said
    healthy, and the pending state was lost. Now the state is a tensor: the checkpoint is
    written, storage stays healthy, and a restart restores every pending prediction."""
    text = configs.learner_config(
        own_broker, tmp_path / "data", f"long-ids-{own_broker.port}",
        configs.model("longids", input_shape=[2], checkpoint="interval_s = 0.5",
                      labels="ttl_s = 3600"),
    )  # fmt: skip
    ids = [f"{n:0256d}" for n in range(LONG_IDS)]
    rows = 2_000  # ~550 kB a message (max_message_bytes: 1 MiB)
    x, p, now = np.zeros((rows, 2), np.float32), np.zeros((rows, 1), np.float32), time.time()
    payloads = [
        encode_predictions(ids[at : at + rows], x, p, [1] * rows, [now] * rows, "long-ids")
        for at in range(0, LONG_IDS, rows)
    ]
    learner = LivefitProcess(text, tmp_path).start()
    try:
        publish(own_broker, "livefit/longids/predictions", payloads)
        pending = lambda: metric(learner, "livefit_pending_predictions", model="longids")  # noqa: E731
        assert settle(pending, 100_000, timeout=120) == 100_000  # labels.max_pending
        with PredictClient(learner.url) as client:
            client.labels("longids", [ids[-1]], [[1.0]])  # trains one sample: a checkpoint
        checkpoints = lambda outcome: metric(  # noqa: E731
            learner, "livefit_checkpoints_total", model="longids", outcome=outcome
        )
        deadline = time.monotonic() + 60
        while checkpoints("ok") + checkpoints("failed") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        size = metric(learner, "livefit_checkpoint_bytes", model="longids")
        assert (checkpoints("ok"), checkpoints("failed")) == (1, 0), learner.log.read_text()[-2000:]
        assert metric(learner, "livefit_storage_healthy") == 1
        assert httpx.get(f"{learner.url}/v2/health/ready", timeout=10).status_code == 200
    finally:
        assert learner.stop() == 0
    print(f"{LONG_IDS:,} predictions with 256-byte ids: checkpoint of {size / 1e6:.1f} MB written")
    assert size * 4 / 3 > 100_000_000  # base64 in the header, as it was, it would not fit
    again = LivefitProcess(text, tmp_path).start()
    try:
        assert metric(again, "livefit_pending_predictions", model="longids") == 99_999
        assert "restored 99999 pending predictions" in again.log.read_text()
    finally:
        assert again.stop() == 0
