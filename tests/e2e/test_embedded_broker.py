"""The zero-install fallback: an embedded amqtt broker (MQTT 3.1.1) that livefit can use."""

from __future__ import annotations

import contextlib
import queue
import time

import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import BrokerAddress
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.connection import MqttConnection
from livefit.server.runtime.broker import EmbeddedAmqtt
from livefit.server.runtime.local_process import free_port

pytest.importorskip("amqtt")
PAYLOAD = b'{"x": [1], "y": [2]}'
# amqtt's own modules warn on import (deprecated APIs); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")


def test_embedded_amqtt_carries_samples_over_mqtt_311() -> None:
    port = free_port()
    broker = EmbeddedAmqtt(port=port)
    assert broker.protocol == "3.1.1"
    address = BrokerAddress("127.0.0.1", port)
    settings = BrokerSettings(protocol="3.1.1", client_id="embedded-test")
    receiver = MqttConnection(address, settings, Metrics())
    sender = MqttConnection(
        address, settings.model_copy(update={"client_id": "embedded-sender"}), Metrics()
    )
    receiver.add_subscription("livefit/demo/samples", qos=1)
    try:
        receiver.start()
        sender.start()
        assert receiver.wait_connected(10) and sender.wait_connected(10)
        deadline = time.monotonic() + 30
        while True:  # sent again until the subscription is in place: none is kept before it
            sender.publish("livefit/demo/samples", PAYLOAD, qos=1).wait_for_publish(10)
            with contextlib.suppress(queue.Empty):
                message = receiver.inbox.get(timeout=1)
                break
            assert time.monotonic() < deadline, "nothing arrived"
        assert message.payload == PAYLOAD and message.qos == 1
        receiver.ack(message)
    finally:
        sender.stop()
        receiver.stop()
        broker.stop()
