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
from livefit.server.mqtt.connection import QUICK_DROP_S, MqttConnection
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


def restart(broker: Mosquitto, connection: MqttConnection) -> float:
    """Restart the broker (its database kept); return once the connection is back, with the
    time it was back at."""
    connects = connection.metrics.registry.get_sample_value("livefit_broker_connects_total")
    broker.restart()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = connection.metrics.registry.get_sample_value("livefit_broker_connects_total")
        if now is not None and connects is not None and now > connects:
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError("the connection was not back within 30 s of the broker's restart")


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
        restart(own_broker, connection)
        again = connection.inbox.get(timeout=20)
        assert again.payload == b"one" and again.session != first.session
        connection.ack(first)  # stale: not sent
        back_at = restart(own_broker, connection)
        third = connection.inbox.get(timeout=20)  # still not acknowledged
        assert third.payload == b"one"
        connection.ack(third)  # on its own connection: sent
        # The next drop comes QUICK_DROP_S after connecting: three quick drops in a row read as
        # a take-over of the client id, whose hold would keep the connection away (and the
        # check below empty for want of a connection). Meanwhile the PUBACK reaches the broker.
        time.sleep(max(1.0, QUICK_DROP_S + 0.2 - (time.monotonic() - back_at)))
        restart(own_broker, connection)
        with pytest.raises(queue.Empty):
            connection.inbox.get(timeout=3.0)
    finally:
        connection.stop()
