"""Several broker nodes: ``broker.url`` as a list or a comma-separated string (absurd inputs
included), the shared credentials, and the node rotation that failover follows
(``mqtt.failover``): which node comes next, the waits between rounds, one move per failed
attempt however many paho callbacks report it, the log line and the counters; and the resend
of a subscription a recovering node refused."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import MAX_BROKER_URLS, BrokerAddress, parse_broker_urls
from livefit.server.config.sections import BrokerSettings
from livefit.server.config.settings import ConfigError, load_settings
from livefit.server.mqtt.connection_status import ConnectionStatus
from livefit.server.mqtt.failover import Failover, NodeRotation, Resubscriber
from tests.configs import learner_config

THREE = "mqtt://10.0.0.1:1883,mqtt://10.0.0.2:1884,mqtt://10.0.0.3"


def nodes(n: int) -> list[BrokerAddress]:
    return [BrokerAddress("127.0.0.1", 2000 + i) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# broker.url with several nodes


@pytest.mark.parametrize(
    "value",
    [THREE, THREE.split(","), " mqtt://10.0.0.1:1883 , mqtt://10.0.0.2:1884,mqtt://10.0.0.3 "],
)
def test_the_nodes_in_order_from_a_list_or_a_comma_separated_string(
    value: str | list[str],
) -> None:
    parsed = parse_broker_urls(value)
    assert [(a.host, a.port) for a in parsed] == [
        ("10.0.0.1", 1883), ("10.0.0.2", 1884), ("10.0.0.3", 1883),
    ]  # fmt: skip
    assert BrokerSettings(url=value).urls() == [u.strip() for u in THREE.split(",")]


def test_one_url_is_one_node() -> None:
    assert parse_broker_urls("mqtts://h") == (BrokerAddress("h", 8883, tls=True),)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ([], "no broker URL"),
        ("", "no broker URL"),
        ("mqtt://a:1,,mqtt://b:2", "empty one"),
        ("mqtt://a:1,", "empty one"),
        ([f"mqtt://h:{1 + i}" for i in range(10_000)], "10000 broker URLs: at most 64"),
        ("mqtt://a:1,mqtts://b:2", "mix"),
        ("mqtt://h:\u0661\u0668\u0668\u0663", "invalid port"),  # Arabic-Indic 1883
        ("mqtt://h:\uff11\uff18\uff18\uff13", "invalid port"),  # fullwidth 1883
        ("mqtt://h:99999", "invalid port"),
        ("mqtt://a:1,http://b:2", "mqtt:// or mqtts://"),
        ("mqtt://a:1,mqtt://a:1", "twice"),
        ("mqtt://u:p@a:1,mqtt://v:p@b:2", "different users"),
        ("mqtt://h:0", "port 0"),  # was taken as no port: 1883, perhaps another broker
        ("mqtt://[::1:1", "Invalid IPv6"),
    ],
)
def test_bad_node_lists_are_refused_with_the_reason(value: str | list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_broker_urls(value)


@pytest.mark.parametrize(
    "value",
    [[], "mqtt://a:1,,mqtt://b:2", "mqtt://a:1,mqtts://b:2", ["mqtt://h"] * (MAX_BROKER_URLS + 1)],
)
def test_settings_refuse_bad_node_lists(value: str | list[str]) -> None:
    with pytest.raises(ValidationError):
        BrokerSettings(url=value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("mqtt://a:1,mqtt://A:1", "twice"),
        ("mqtt://h,mqtt://h:1883", "twice"),
        ("mqtt://h:abc", "invalid port"),
        ("mqtt://h:99999", "invalid port"),
        ("mqtt://h:0", "port 0"),
        ("mqtt://u:p@:1883", "must look like"),
        ("mqtt://u:p#q@h:1", "must look like"),
        ("mqtt://u@a:1,mqtt://u:p@b:2", "different users"),
        ("mqtt://[::1:1", "Invalid IPv6"),
    ],
)
def test_the_settings_refuse_what_the_clients_would_refuse_when_the_file_loads(
    tmp_path: Path, value: str, says: str
) -> None:
    """Before, these loaded, and `livefit serve`/`replica` died in startup with a traceback
    (or, for port 0, connected to 1883)."""
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    with pytest.raises(ConfigError, match=says) as refused:
        load_settings(config, environ={"LIVEFIT_BROKER__URL": value})
    assert "LIVEFIT_BROKER__URL" in str(refused.value)


@pytest.mark.parametrize(
    "value",
    [
        "mqtt://replica:Ab3/x+SECRET@mosquitto:1883",  # a base64 password: '/' in it
        "mqtt://a:1,mqtt://u:Ab/SECRET@b:2",
        "mqtt://u:SE,CRET@h:1",  # a comma splits the URL: neither piece may be shown
        "mqtt://u:p@SECRET#x@h:1",
        "mqtt://u:SECRET@h:1\nmqtt://h:2",
    ],
)
def test_a_refused_url_never_shows_its_password(tmp_path: Path, value: str) -> None:
    """Before, a password holding '/' (or a comma) was shown whole in the error, twice."""
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    with pytest.raises(ConfigError) as refused:
        load_settings(config, environ={"LIVEFIT_BROKER__URL": value})
    for secret in ("SECRET", "SE", "CRET", "Ab3", "Ab/"):
        assert secret not in str(refused.value), str(refused.value)


def test_credentials_written_once_apply_to_every_node_and_are_never_shown() -> None:
    parsed = parse_broker_urls("mqtt://a:1,mqtt://learner:s3cret@b:2,mqtt://c:3")
    assert {(a.username, a.password) for a in parsed} == {("learner", "s3cret")}
    assert all("s3cret" not in str(a) for a in parsed)
    with pytest.raises(ValueError) as refused:
        parse_broker_urls("mqtt://a:1,mqtt://learner:s3cret@b:x")
    assert "s3cret" not in str(refused.value)


def test_the_environment_carries_nodes_as_a_comma_separated_string_or_a_toml_list(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    for raw in (THREE, '["mqtt://10.0.0.1:1883", "mqtt://10.0.0.2:1884", "mqtt://10.0.0.3"]'):
        settings = load_settings(config, environ={"LIVEFIT_BROKER__URL": raw})
        assert len(parse_broker_urls(settings.broker.url)) == 3
    with pytest.raises(ConfigError) as refused:
        load_settings(config, environ={"LIVEFIT_BROKER__URL": "mqtt://u:pw@a:1,mqtts://b:2"})
    assert "LIVEFIT_BROKER__URL" in str(refused.value) and "pw" not in str(refused.value)


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


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("LIVEFIT_MODELS__DEMO__WEIGHTS__PULL_URL", "http://u:SECRET@learner:8000"),
        ("LIVEFIT_HTTP__PUBLIC_URL", "http://u:SECRET@learner:8000"),
    ],
)
def test_pull_urls_carry_no_password(tmp_path: Path, key: str, value: str) -> None:
    """A replica logs its pull origin at start; before, a password in it was logged with it."""
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    with pytest.raises(ConfigError, match="no user or password") as refused:
        load_settings(config, environ={key: value})
    assert "SECRET" not in str(refused.value)


def test_readiness_names_every_node_once_each_has_failed() -> None:
    """Before, with every node down, readiness named the first node alone with the count of
    the attempts on all of them: 'MQTT broker at mqtt://n0 unreachable (6 ... failed)'."""
    three = nodes(3)
    status = ConnectionStatus(three[0], "learner-demo", BrokerSettings(), nodes=three)
    status.failed()
    assert str(three[0]) in status.reason() and "every node" not in status.reason()
    status.failed()
    status.failed()
    reason = status.reason()
    assert "every node" in reason and all(str(node) in reason for node in three), reason
    status.succeeded()
    alone = ConnectionStatus(three[0], "learner-demo", BrokerSettings())
    for _ in range(5):
        alone.failed()
    assert "every node" not in alone.reason() and str(three[0]) in alone.reason()
