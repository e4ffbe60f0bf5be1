"""A replica refusing weights, as an operator meets it (issue 45, item 7): a flood of garbage
on its weight topic, then a learner signing with a rotated key. Through a real mosquitto, a
real learner and a real replica: refusals are a few log lines however many messages come (each
counted in ``livefit_weights_received_total``), and a replica that has refused every snapshot
for ``weights.refused_unready_s`` says so in readiness while it keeps serving the last good
weights. The verifier's rules in process: ``tests/unit/weights/test_receiver.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import free_port, stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model
from tests.e2e.test_two_learners_one_replica import clear_retained, make_key
from tests.layouts import metric_sum

TOPIC = "livefit/demo/weights"
UNREADY_S = 4  # weights.refused_unready_s of the replica
REFUSED = ("unsigned", "bad_payload", "superseded")  # what garbage ends as
PUBLISHED = "livefit_weights_published_total"  # every snapshot sent: new, restored, re-signed


@dataclass
class Fleet:
    broker: Mosquitto
    workdir: Path
    learner: LivefitProcess
    replica: LivefitProcess
    rotated_key: Path


def learner_text(broker: Mosquitto, storage: Path, key: Path) -> str:
    weights = f'publish_interval_s = 0.2\nsigning_key_file = "{key}"'
    return learner_config(broker, storage, f"refusals-{broker.port}", model(weights=weights))


@pytest.fixture(scope="module")
def fleet(broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("refusals")
    private, public = make_key(workdir / "key-1")
    rotated, _ = make_key(workdir / "key-2")
    storage = workdir / "data"
    learner = LivefitProcess(learner_text(broker, storage, private), workdir, name="learner")
    weights = f'verify_key_file = "{public}"\nrefused_unready_s = {UNREADY_S}'
    replica = LivefitProcess(
        learner_config(broker, workdir / "data-replica", f"refusals-replica-{broker.port}",
                       model(weights=weights)),
        workdir, command="replica", name="replica",
    )  # fmt: skip
    try:
        learner.start(ready_timeout_s=None)
        replica.start(ready_timeout_s=None)
        learner.wait_ready(180)
        publish(broker, 200, seed=1)
        replica.wait_ready(120)
        yield Fleet(broker, workdir, learner, replica, rotated)
    finally:
        stop_all([replica, learner])
        clear_retained(broker, [TOPIC])


def publish(broker: Mosquitto, count: int, seed: int) -> None:
    stream = LinearStream(input_dim=8, seed=seed)
    with SamplePublisher(broker.url, "livefit/demo/samples", fmt="msgpack") as publisher:
        for _ in range(count // 20):
            x, y = stream.sample(20)
            publisher.publish(x, y, batched=True)


def refusal_lines(replica: LivefitProcess, after: int = 0) -> list[str]:
    """The replica's log lines, from byte ``after`` on, that say weights were refused."""
    with replica.log.open("rb") as log:
        log.seek(after)
        text = log.read().decode(errors="replace")
    return [line for line in text.splitlines() if "refused (" in line]


def counted(replica: LivefitProcess, outcomes: tuple[str, ...]) -> float:
    return sum(replica.metric("livefit_weights_received_total", model="demo", outcome=o)
               for o in outcomes)  # fmt: skip


def served(replica: LivefitProcess) -> int:
    return int(replica.metric("livefit_serving_version", model="demo"))


def settled(learner: LivefitProcess, replica: LivefitProcess, samples: int) -> int:
    """The version the replica serves once the learner has trained ``samples`` and published
    nothing newer for 0.5 s (2.5 publish intervals), and the replica serves it."""
    learner.wait_for_metric("livefit_train_samples_total", samples, model="demo")

    def published() -> int:
        return int(learner.metric("livefit_published_version", model="demo"))

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        wanted = published()
        if served(replica) >= wanted:
            time.sleep(0.5)
            if published() == wanted:
                return served(replica)
        time.sleep(0.1)
    raise AssertionError(f"replica at v{served(replica)} never caught up with the learner")


def predict(replica: LivefitProcess) -> httpx.Response:
    return httpx.post(f"{replica.url}/v1/models/demo:predict",
                      json={"instances": [[0.1] * 8]}, timeout=30)  # fmt: skip


def test_garbage_on_the_weight_topic_is_a_few_lines_and_every_message_counted(
    fleet: Fleet,
) -> None:
    """2,000 garbage messages produced 1,908 WARNING lines (360 KB) on the replica."""
    replica, learner = fleet.replica, fleet.learner
    version = settled(learner, replica, 200)  # no new version is published during the flood
    before, offset = counted(replica, REFUSED), replica.log.stat().st_size
    sent_before = metric_sum(learner, PUBLISHED)
    connects_before = replica.metric("livefit_broker_connects_total")
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", fleet.broker.port)
    client.loop_start()
    try:
        sent = [client.publish(TOPIC, b"garbage %d" % n, qos=1) for n in range(2000)]
        for info in sent:
            info.wait_for_publish(30)
    finally:
        client.disconnect()
        client.loop_stop()
    deadline = time.monotonic() + 60
    while counted(replica, REFUSED) < before + 2000 and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = refusal_lines(replica, offset)
    by_outcome = {o: counted(replica, (o,)) for o in REFUSED}
    print(f"\n2,000 garbage messages: {len(lines)} refusal lines, counted {by_outcome}")
    extra = counted(replica, REFUSED) - before - 2000
    assert extra >= 0, "every message is counted"
    # More only where a real message was dropped unread from the full inbox (``superseded``):
    # a snapshot the learner sent meanwhile, or the retained one and unacknowledged garbage
    # sent again after the replica reconnected (a CI run under load counted 2,002).
    if extra:
        assert (
            metric_sum(learner, PUBLISHED) > sent_before
            or replica.metric("livefit_broker_connects_total") > connects_before
        ), f"{extra:.0f} refusals more than garbage messages, with no other message to explain them"
    assert 1 <= len(lines) <= 4, lines  # one per outcome, then one per 10 s at most
    assert served(replica) == version and predict(replica).status_code == 200
    # The learner's next snapshots still arrive and are served.
    publish(fleet.broker, 100, seed=2)
    newest = learner.wait_for_metric("livefit_train_samples_total", 300, model="demo")
    assert newest >= 300
    wanted = int(learner.metric("livefit_published_version", model="demo"))
    deadline = time.monotonic() + 60
    while served(replica) < wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert served(replica) >= wanted > version
    replica.wait_ready(30)


def test_a_rotated_key_turns_readiness_503_and_logs_a_few_lines(fleet: Fleet) -> None:
    """The learner restarted with another signing key, the replica still verifying the old
    one: every snapshot is ``bad_signature``. Readiness says so within refused_unready_s (it
    stayed 200 for ever), predictions keep their last good weights, the log stays small (it
    was a line per snapshot)."""
    replica = fleet.replica
    fleet.learner.stop()
    version = served(replica)
    offset = replica.log.stat().st_size
    refused_before = counted(replica, ("bad_signature",))
    rotated = LivefitProcess(
        learner_text(fleet.broker, fleet.workdir / "data", fleet.rotated_key), fleet.workdir,
        name="learner-rotated", port=free_port(),
    )  # fmt: skip
    streaming = threading.Event()

    def stream() -> None:
        seed = 10
        while not streaming.wait(0.3):
            publish(fleet.broker, 20, seed=seed)
            seed += 1

    publisher = threading.Thread(target=stream, name="samples")
    try:
        # Not waiting for it to be ready: its first snapshot (the restored weights) can reach the
        # replica seconds before its readiness (a CI run under load saw 6 s), and the clock below
        # runs from that first refusal.
        rotated.start(ready_timeout_s=None)
        publisher.start()
        started = first = time.monotonic()
        while True:
            scraped = time.monotonic()
            if counted(replica, ("bad_signature",)) != refused_before:
                break
            first = scraped  # none refused yet: a lower bound of the first refusal's time
            assert first - started < 180, "no snapshot of the new key reached the replica"
            assert rotated.alive(), rotated.tail()
            time.sleep(0.05)
        problems: list[str] = []
        while time.monotonic() - first < 60:
            response = httpx.get(f"{replica.url}/v2/health/ready", timeout=5)
            if response.status_code == 503:
                problems = response.json().get("problems", [])
                break
            time.sleep(0.2)
        took = time.monotonic() - first
        print(f"\nreadiness 503 {took:.1f} s after the first refused snapshot: {problems}")
        assert problems, "readiness never said the replica refuses every snapshot"
        assert took >= UNREADY_S - 0.5
        assert any(p.startswith("model demo: weights of demo: refused every snapshot for ")
                   and "bad_signature: Ed25519 signature does not verify" in p
                   and p.endswith(f"still serving version {version}") for p in problems), problems  # fmt: skip
        assert predict(replica).status_code == 200 and served(replica) == version
        # 25 or more snapshots refused in all, snapshots going out every 0.2 s: a line each (the
        # old log) would fail below; the log interval's rollover is test_receiver.py's
        time.sleep(5)
    finally:
        streaming.set()
        if publisher.is_alive():
            publisher.join(30)
        rotated.stop()
    refusals = counted(replica, ("bad_signature",)) - refused_before
    lines = refusal_lines(replica, offset)
    print(f"{refusals:.0f} snapshots refused as bad_signature, {len(lines)} refusal lines")
    assert refusals >= 20
    assert 1 <= len(lines) <= 4, lines
    assert sum("readiness fails until weights verify again" in line
               for line in replica.log.read_text(errors="replace").splitlines()) == 1  # fmt: skip
