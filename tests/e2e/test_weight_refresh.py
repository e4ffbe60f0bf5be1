"""The learner's publisher on a real mosquitto: signed envelopes, retained, re-signed while idle.

A ``WeightPublisher`` in this process publishes one snapshot and, with nothing new to send,
publishes it again every ``refresh_interval_s`` with a new ``signed_at`` (same version, same
``created_at``): a receiver that limits the age of what it accepts keeps an idle learner's
weights. A receiver counts the re-signed copies as ``refreshed``, never as new weights.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.connection import MqttConnection
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights import publisher as publisher_module
from livefit.server.weights.format import open_envelope
from livefit.server.weights.keys import SigningKey
from livefit.server.weights.metrics import WeightsPublishedMetrics
from livefit.server.weights.publisher import WeightPublisher
from livefit.server.weights.receiver import WeightReceiver
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.store import WeightStore
from livefit.server.wire.snapshot import Snapshot
from tests.weight_envelopes import Weights

TOPIC = "refresh/weights"


def _listen(
    broker: Mosquitto, topic: str, received: list[bytes], arrived: threading.Condition
) -> paho.Client:
    """A plain paho subscriber appending every message on ``topic`` to ``received``."""

    def on_message(_c: object, _u: object, message: paho.MQTTMessage) -> None:
        with arrived:
            received.append(bytes(message.payload))
            arrived.notify_all()

    listener = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    listener.on_message = on_message
    listener.connect("127.0.0.1", broker.port)
    listener.subscribe(topic, qos=1)
    listener.loop_start()
    return listener


def _connection(broker: Mosquitto, metrics: Metrics) -> MqttConnection:
    settings = BrokerSettings.model_validate({"client_id": f"refresh-{time.time_ns()}"})
    return MqttConnection(parse_broker_url(broker.url), settings, metrics)


def test_idle_learner_re_signs_its_newest_snapshot(broker: Mosquitto) -> None:
    weights, key, metrics = Weights.of("linear"), SigningKey.generate(), Metrics()
    received: list[bytes] = []
    arrived = threading.Condition()
    listener = _listen(broker, TOPIC, received, arrived)
    connection = _connection(broker, metrics)
    publisher = WeightPublisher(
        "demo", TOPIC, weights.names, weights.fingerprint, connection, metrics, WeightStore(2),
        key, max_inline_bytes=1 << 20, refresh_interval_s=0.3,
    )  # fmt: skip
    try:
        connection.start()
        assert connection.wait_connected(10)
        publisher.start()
        created = time.time() - 5
        arrays = tuple(np.asarray(a) for a in weights.arrays)
        publisher.offer(Snapshot("demo", 7, arrays, created, 70, lineage="d" * 32))
        with arrived:
            assert arrived.wait_for(lambda: len(received) >= 3, timeout=15), len(received)
    finally:
        publisher.stop()
        connection.stop()
        listener.disconnect()
        listener.loop_stop()
    headers = [open_envelope(message).header for message in received[:3]]
    assert {(h.version, h.lineage, h.created_at) for h in headers} == {(7, "d" * 32, created)}
    signed = [h.signed_at for h in headers]
    assert signed == sorted(signed) and len(set(signed)) == 3
    assert (
        metrics.group(WeightsPublishedMetrics)
        .weights_published.labels(model="demo", kind="refresh")
        ._value.get()
        >= 2
    )
    assert (
        metrics.group(WeightsPublishedMetrics)
        .weights_published.labels(model="demo", kind="inline")
        ._value.get()
        == 1
    )

    outcomes: list[str] = []
    receiver = WeightReceiver(
        parse_broker_url(broker.url), "demo", TOPIC, weights.fingerprint, lambda _: None,
        Authenticator(key.public), on_outcome=outcomes.append, max_age_s=60,
    )  # fmt: skip
    for message in received[:3]:
        receiver._process(message)
    assert outcomes == ["accepted", "refreshed", "refreshed"]
    # Without the refreshes, the only copy a new receiver could get would be the first one:
    late = WeightReceiver(
        parse_broker_url(broker.url), "demo", TOPIC, weights.fingerprint, lambda _: None,
        Authenticator(key.public), on_outcome=outcomes.append, max_age_s=1,
    )  # fmt: skip
    time.sleep(max(0.0, headers[0].signed_at + 1.05 - time.time()))
    late._process(received[0])
    assert outcomes[-1] == "expired"


def test_the_topic_gets_at_most_one_snapshot_per_interval_and_the_last_on_stop(
    broker: Mosquitto,
) -> None:
    """The trainer hands snapshots over every ``serve_interval_s`` (50 ms); the weight topic
    gets the newest once per ``publish_interval_s`` and, on stop, the very last one."""
    weights, key, metrics = Weights.of("linear"), SigningKey.generate(), Metrics()
    received: list[bytes] = []
    topic = f"{TOPIC}/rate-{time.time_ns()}"
    arrived = threading.Condition()
    listener = _listen(broker, topic, received, arrived)
    connection = _connection(broker, metrics)
    publisher = WeightPublisher(
        "demo", topic, weights.names, weights.fingerprint, connection, metrics, WeightStore(2),
        key, max_inline_bytes=1 << 20, publish_interval_s=0.5,
    )  # fmt: skip
    arrays = tuple(np.asarray(a) for a in weights.arrays)
    offered = 0
    try:
        connection.start()
        assert connection.wait_connected(10)
        publisher.start()
        started = time.monotonic()
        while time.monotonic() - started < 1.2:  # 24 snapshots, 50 ms apart
            offered += 1
            publisher.offer(Snapshot("demo", offered, arrays, time.time(), offered, "e" * 32))
            time.sleep(0.05)
    finally:
        publisher.stop()
        connection.stop()
        last = lambda: received and open_envelope(received[-1]).header.version == offered  # noqa: E731
        with arrived:  # the one published on stop, on its way to the listener
            arrived.wait_for(last, timeout=10)
        listener.disconnect()
        listener.loop_stop()
    versions = [open_envelope(message).header.version for message in received]
    # 1.2 s at one per 0.5 s: the first at once, one or two more, and the last on stop
    assert 2 <= len(versions) <= 4, versions
    assert versions == sorted(versions) and versions[-1] == offered, (versions, offered)


def test_a_snapshot_is_encoded_once_for_the_topic_and_the_local_feed(broker: Mosquitto) -> None:
    """A split learner hands the same snapshot to the weight topic and to its local feed; the
    second asks for the encoding the first made (equal bytes, the same object), and a newer
    snapshot is encoded anew."""
    weights, key, metrics = Weights.of("linear"), SigningKey.generate(), Metrics()
    publisher = WeightPublisher(
        "demo", TOPIC, weights.names, weights.fingerprint, _connection(broker, metrics), metrics,
        WeightStore(2), key, max_inline_bytes=1 << 20,
    )  # fmt: skip
    arrays = tuple(np.asarray(a) for a in weights.arrays)
    first = Snapshot("demo", 7, arrays, time.time(), 70, lineage="d" * 32)
    encoded = publisher.encode(first)
    assert publisher.encode(first) is encoded
    second = Snapshot("demo", 8, arrays, time.time(), 80, lineage="d" * 32)
    again = publisher.encode(second)
    assert again is not encoded and again.version == 8 and again.sha256 != encoded.sha256
    # an equal snapshot that is another object (another trainer hand-over) is encoded anew
    assert (
        publisher.encode(Snapshot("demo", 8, arrays, second.created_at, 80, "d" * 32)) is not again
    )


def test_two_learners_fighting_over_the_topic_back_off_for_good_and_log_little(
    broker: Mosquitto, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two learners of one model (two keys) on one broker put their own snapshot back after
    each other's (an outside attack on issue 26 item 9): each restore must wait 1, 2, 4 ... up
    to 60 s and stay there while the fight goes on, and the error lines come once, then at most
    once a minute. Before, the gap went back to 0 each time it reached its maximum (a burst of
    restores every cycle) and every foreign message was an ERROR line (50 garbage retained
    messages: 58 lines). Time is scaled here: gaps from 0.05 s to 0.3 s."""
    monkeypatch.setattr(publisher_module, "RESTORE_GAP_MIN_S", 0.05)
    monkeypatch.setattr(publisher_module, "RESTORE_GAP_MAX_S", 0.3)
    monkeypatch.setattr(publisher_module, "_REFRESH_POLL_S", 0.01)
    caplog.set_level(logging.INFO, logger=publisher_module.__name__)
    weights, topic = Weights.of("linear"), f"{TOPIC}/fight-{time.time_ns()}"
    arrays = tuple(np.asarray(a) for a in weights.arrays)
    learners: list[tuple[WeightPublisher, MqttConnection, list[float]]] = []
    for lineage in ("a" * 32, "b" * 32):
        metrics = Metrics()
        connection = _connection(broker, metrics)
        publisher = WeightPublisher(
            "demo", topic, weights.names, weights.fingerprint, connection, metrics,
            WeightStore(2), SigningKey.generate(), max_inline_bytes=1 << 20,
        )  # fmt: skip
        publisher.watch_topic()
        restores: list[float] = []
        learners.append((publisher, connection, restores))
        publisher._restore_if_due = _recording(publisher, restores)  # type: ignore[method-assign]
        connection.start()
        assert connection.wait_connected(10)
        publisher.start()
        publisher.offer(Snapshot("demo", 1, arrays, time.time(), 10, lineage=lineage))
    garbage = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    try:
        time.sleep(4.0)
        garbage.connect("127.0.0.1", broker.port)
        garbage.loop_start()
        for i in range(50):
            garbage.publish(topic, f"garbage {i}".encode(), qos=1, retain=True).wait_for_publish(5)
        time.sleep(0.5)
    finally:
        garbage.disconnect()
        garbage.loop_stop()
        for publisher, connection, _ in learners:
            publisher.stop()
            connection.stop()
    for _, _, restores in learners:
        gaps = np.diff(restores)
        assert len(restores) >= 6, restores
        # 0, 0.05, 0.1, 0.2 s, then 0.3 s for good: never a burst of restores again. A restore
        # that a loaded machine runs late shortens the gap after it (0.36 s, then 0.25 s: seen
        # on 2 busy cores), so each gap is held to most of the maximum and their median to it;
        # the old bug (the gap back to 0 at the maximum) gives gaps of 0 to 0.1 s.
        assert gaps[4:].min() >= 0.3 * 0.6, gaps.round(3).tolist()
        assert np.median(gaps[4:]) >= 0.3 * 0.95, gaps.round(3).tolist()
    foreign = [r for r in caplog.records if "is not this learner's" in r.getMessage()]
    errors = [r for r in foreign if r.levelno == logging.ERROR]
    assert len(errors) == 2, [r.getMessage()[:80] for r in errors]  # one per learner
    # Apart from those, the second learner may have found the first's snapshot retained at
    # subscribe: a WARNING of its own kind, which does not hold back its ERROR.
    assert len(foreign) - len(errors) <= 1, [r.getMessage()[:80] for r in foreign]
    put_back = [r for r in caplog.records if "put back on" in r.getMessage()]
    assert len(put_back) == 2, len(put_back)


def _recording(publisher: WeightPublisher, restores: list[float]) -> Callable[[], None]:
    """``publisher._restore_if_due``, appending the time of each restore it makes."""
    restore_if_due = publisher._restore_if_due
    counter = publisher.metrics.group(WeightsPublishedMetrics).weights_published

    def recording() -> None:
        before = counter.labels(model="demo", kind="restore")._value.get()
        restore_if_due()
        if counter.labels(model="demo", kind="restore")._value.get() > before:
            restores.append(time.monotonic())

    return recording
