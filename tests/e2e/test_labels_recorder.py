"""The serving side's prediction recorder through a real mosquitto: records arrive on the
predictions topic in the learner's wire format, a request larger than the buffer is dropped and
counted, a recorder with no broker still answers every call (nothing waits), a label is forwarded once the broker holds it, and stop leaves no
thread behind."""

from __future__ import annotations

import threading
import time

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client import CollectorRegistry

from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.config.sections import BrokerSettings
from livefit.server.labels.recorder import PredictionRecorder
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.wire.codec import SampleSpec
from livefit.server.wire.labels import decode_labels, decode_predictions

SPEC = SampleSpec(input_shape=(2,), target_shape=(1,))


def test_records_and_labels_reach_the_broker(broker: Mosquitto) -> None:
    got: dict[str, list[bytes]] = {"predictions": [], "labels": []}
    arrived = threading.Event()

    def on_message(client, userdata, message) -> None:
        got[message.topic.rsplit("/", 1)[1]].append(message.payload)
        if got["predictions"] and got["labels"]:
            arrived.set()

    listener = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    listener.on_message = on_message
    listener.connect("127.0.0.1", broker.port)
    listener.subscribe("rec/m/#", qos=1)
    listener.loop_start()
    metrics = Metrics(CollectorRegistry())
    recorder = PredictionRecorder(
        "m", ("rec/m/predictions", "rec/m/labels"), parse_broker_url(broker.url),
        BrokerSettings(url=broker.url), f"recorder-test-{broker.port}", metrics, max_rows=4,
    )  # fmt: skip
    try:
        time.sleep(0.3)  # the subscription is in place
        recorder.record(["a", 2], np.ones((2, 2), np.float32), np.zeros((2, 1)), 9)
        recorder.record([f"x{i}" for i in range(5)], np.ones((5, 2)), np.zeros((5, 1)), 9)
        recorder.publish_label(b'{"id": "a", "y": [1]}', "application/json", 10.0)
        assert arrived.wait(10)
    finally:
        recorder.stop()
        listener.disconnect()
        listener.loop_stop()
    records = decode_predictions(got["predictions"][0], SPEC, (1,), "application/msgpack")
    assert records.ids == ["a", 2] and records.version == [9, 9]
    assert decode_labels(got["labels"][0], SPEC).ids == ["a"]
    sample = metrics.registry.get_sample_value
    assert sample("livefit_prediction_records_total", {"model": "m", "outcome": "sent"}) == 2
    assert sample("livefit_prediction_records_total", {"model": "m", "outcome": "dropped"}) == 5


def test_recording_never_waits_for_an_absent_broker() -> None:
    metrics = Metrics(CollectorRegistry())
    url = "mqtt://127.0.0.1:9"  # nothing listens there
    recorder = PredictionRecorder(
        "m", ("p", "l"), parse_broker_url(url), BrokerSettings(url=url), "recorder-absent",
        metrics, max_rows=10,
    )  # fmt: skip
    try:
        for i in range(100):  # returns at once each time: nothing waits for the broker
            recorder.record([i], np.ones((1, 2)), np.zeros((1, 1)), 1)
    finally:
        recorder.stop()
    sample = metrics.registry.get_sample_value
    sent = sample("livefit_prediction_records_total", {"model": "m", "outcome": "sent"})
    dropped = sample("livefit_prediction_records_total", {"model": "m", "outcome": "dropped"})
    assert sent + dropped == 100  # queued in the MQTT client for a reconnect, or counted
