"""Several broker nodes: the node rotation that failover follows (``mqtt.failover``): which
node comes next, the waits between rounds, one move per failed
attempt however many paho callbacks report it, the log line and the counters; and the resend
of a subscription a recovering node refused."""

from __future__ import annotations

import logging
import threading
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import MAX_BROKER_URLS, BrokerAddress
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.failover import Failover, NodeRotation, Resubscriber


def nodes(n: int) -> list[BrokerAddress]:
    return [BrokerAddress("127.0.0.1", 2000 + i) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# NodeRotation


def test_rotation_goes_round_the_nodes_without_waiting_then_backs_off_between_rounds() -> None:
    rotation = NodeRotation(nodes(3), min_s=1, max_s=5)
    seen, waits = [], []
    for _ in range(12):
        waits.append(rotation.advance())
        seen.append(rotation.current.port)
    assert seen == [2001, 2002, 2000] * 4
    assert waits == [0, 0, 1, 0, 0, 2, 0, 0, 4, 0, 0, 5]


def test_a_connection_starts_a_new_round_on_the_node_that_took_it() -> None:
    rotation = NodeRotation(nodes(3), min_s=1, max_s=60)
    for _ in range(6):
        rotation.advance()
    rotation.advance()  # at node 1 now
    rotation.connected()
    assert rotation.current.port == 2001
    assert [rotation.advance() for _ in range(3)] == [0, 0, 1]


def test_one_node_waits_the_back_off_at_every_failure() -> None:
    rotation = NodeRotation(nodes(1), min_s=0.5, max_s=3)
    assert [rotation.advance() for _ in range(4)] == [1, 2, 3, 3]
    assert rotation.current.port == 2000


def test_rotation_over_many_rounds_stays_bounded() -> None:
    rotation = NodeRotation(nodes(MAX_BROKER_URLS), min_s=1, max_s=30)
    waits = [rotation.advance() for _ in range(MAX_BROKER_URLS * 200)]
    assert max(waits) == 30 and waits.count(0) == (MAX_BROKER_URLS - 1) * 200


def test_rotation_needs_a_node() -> None:
    with pytest.raises(ValueError):
        NodeRotation([], 1, 1)


# ---------------------------------------------------------------------------------------------
# Failover: a real (unconnected) paho client pointed at the next node


def client() -> paho.Client:
    return paho.Client(CallbackAPIVersion.VERSION2, client_id="t", protocol=paho.MQTTv311)


def test_failover_points_the_client_at_the_next_node_once_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    failover = Failover(nodes(3), BrokerSettings(), "learner-demo", metrics)
    paho_client = client()
    failover.start(paho_client, keepalive=30)
    assert (paho_client.host, paho_client.port) == ("127.0.0.1", 2000)
    failover.attempt_started()
    failover.connected(paho_client)
    read = metrics.registry.get_sample_value
    assert read("livefit_broker_node_connections", {"node": "127.0.0.1:2000"}) == 1
    failover.disconnected()
    with caplog.at_level(logging.WARNING, logger="livefit.server.mqtt.failover"):
        failover.failed(paho_client, "connection lost: Unspecified error")
        failover.failed(paho_client, "no session")  # the same attempt, reported again
    assert (paho_client.host, paho_client.port, paho_client.keepalive) == ("127.0.0.1", 2001, 30)
    assert read("livefit_broker_failovers_total") == 1
    assert read("livefit_broker_node_connections", {"node": "127.0.0.1:2000"}) == 0
    assert "fails over from broker node 127.0.0.1:2000 to 127.0.0.1:2001" in caplog.text
    assert "connection lost: Unspecified error" in caplog.text
    failover.attempt_started()
    failover.failed(paho_client, "nothing answered")
    assert paho_client.port == 2002


def test_failover_with_one_node_leaves_the_client_to_paho() -> None:
    failover = Failover(nodes(1), BrokerSettings(), "learner-demo", Metrics())
    paho_client = client()
    failover.start(paho_client, keepalive=30)
    failover.attempt_started()
    failover.failed(paho_client, "nothing answered")
    assert paho_client.port == 2000


# ---------------------------------------------------------------------------------------------
# Resubscriber: a subscription a recovering node refused is sent again


class QuickResubscriber(Resubscriber):
    FIRST_WAIT_S = 0.05
    MAX_WAIT_S = 0.2


def test_a_refused_subscription_is_sent_again_once_at_a_time_with_growing_waits() -> None:
    resubscriber = QuickResubscriber("weight stream of demo")
    sent = threading.Event()
    calls: list[float] = []

    def resend() -> None:
        calls.append(time.monotonic())
        sent.set()

    start = time.monotonic()
    resubscriber.refused("livefit/demo/weights", resend)
    resubscriber.refused("livefit/demo/weights", resend)  # one waits already: no second
    assert sent.wait(5.0)
    time.sleep(0.2)
    assert len(calls) == 1 and calls[0] - start >= 0.05
    sent.clear()
    resubscriber.refused("livefit/demo/weights", resend)  # the wait has doubled
    assert sent.wait(5.0) and calls[1] - calls[0] >= 0.1
    resubscriber.cancel()


def test_a_cancelled_resubscriber_sends_nothing() -> None:
    resubscriber = Resubscriber("weight stream of demo")  # waits 1 s
    calls: list[int] = []
    resubscriber.refused("t", lambda: calls.append(1))
    resubscriber.cancel()
    resubscriber.refused("t", lambda: calls.append(2))
    time.sleep(1.2)
    assert calls == []
