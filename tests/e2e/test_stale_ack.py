"""An acknowledgement belongs to the connection its message came on (``MqttConnection.ack``):
after a reconnect the broker redelivers what was not acknowledged, and an ack of the earlier
delivery is not sent (on a cluster the new node may use that packet id for another message).
Here one mosquitto restarted stands in for the switch: the message comes again until it is
acknowledged on the connection that delivered it, and then never again.

On the code before (every ack sent on whatever connection is up) the stale ack acknowledged
the redelivery, and the third delivery this test waits for never came.
"""

from __future__ import annotations

import queue
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import parse_broker_urls
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.connection import MqttConnection, RawMessage
from livefit.server.runtime.mosquitto import Mosquitto

TOPIC = "stale-ack/samples"


def publish_one(broker: Mosquitto, payload: bytes) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="stale-ack-publisher")
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        client.publish(TOPIC, payload, qos=1).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def restart_and_receive(
    broker: Mosquitto, connection: MqttConnection, timeout_s: float = 20.0
) -> RawMessage:
    """Restart the broker (its database kept) and return the message it redelivers."""
    connects = connection.metrics.registry.get_sample_value("livefit_broker_connects_total")
    broker.restart()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = connection.metrics.registry.get_sample_value("livefit_broker_connects_total")
        if now is not None and connects is not None and now > connects:
            break
        time.sleep(0.05)
    return connection.inbox.get(timeout=timeout_s)


def test_an_ack_from_an_earlier_connection_is_not_sent(own_broker: Mosquitto) -> None:
    settings = BrokerSettings(url=own_broker.url, reconnect_min_s=0.5, reconnect_max_s=1)
    connection = MqttConnection(
        parse_broker_urls(own_broker.url), settings, Metrics(), client_id="stale-ack"
    )
    connection.add_subscription(TOPIC, qos=1)
    connection.start()
    try:
        assert connection.wait_connected(20)
        publish_one(own_broker, b"one")
        first = connection.inbox.get(timeout=20)
        again = restart_and_receive(own_broker, connection)
        assert again.payload == b"one" and again.session != first.session
        connection.ack(first)  # stale: not sent
        third = restart_and_receive(own_broker, connection)  # still not acknowledged
        assert third.payload == b"one"
        connection.ack(third)  # on its own connection: sent
        time.sleep(1.0)  # the PUBACK reaches the broker before it stops
        with pytest.raises(queue.Empty):
            restart_and_receive(own_broker, connection, timeout_s=5.0)
    finally:
        connection.stop()
