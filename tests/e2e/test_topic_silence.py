"""A samples topic the broker's ACL forbids the learner to read: mosquitto grants the
subscription (MQTT 3.1.1 and 5 alike) and then delivers nothing, so the learner is ready,
connected and silent. It must say so: a warning naming the model, the topic and ACLs, once the
topic has delivered nothing ``silent_topic_warn_s`` after the subscription, and the gauge
``livefit_ingest_seconds_since_message``. A real mosquitto with a password file and an ACL."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.clients.payloads import encode_samples
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model

USERS = {"learner": "learner-pw-1", "publisher": "publisher-pw-2"}
# The learner may publish everything and read its labels, but not read model "blind"'s samples.
ACL = """
user learner
topic write livefit/#
topic read livefit/fed/samples
topic read livefit/+/labels
topic read livefit/+/predictions

user publisher
topic write livefit/+/samples
"""
BLIND_WARN_S, FED_WARN_S = 2, 8


@pytest.fixture
def acl_broker(tmp_path: Path) -> Mosquitto:
    passwd = tmp_path / "passwd"
    for i, (user, password) in enumerate(USERS.items()):
        create = ["-c"] if i == 0 else []
        command = ["mosquitto_passwd", *create, "-b", str(passwd), user, password]
        subprocess.run(command, check=True, capture_output=True, timeout=10)
    passwd.chmod(0o600)
    (tmp_path / "acl").write_text(ACL)
    extra = f"password_file {passwd}\nacl_file {tmp_path / 'acl'}\n"
    broker = Mosquitto(tmp_path / "broker", extra_config=extra).start()
    yield broker
    broker.stop()


def test_a_topic_the_acl_forbids_is_reported_after_the_silence_setting(
    acl_broker: Mosquitto, tmp_path: Path
) -> None:
    url = f"mqtt://learner:{USERS['learner']}@127.0.0.1:{acl_broker.port}"
    # "fed" gets longer to receive its message than "blind" to warn: on a loaded host the start,
    # the publisher's connect and its publish take seconds; its silence is checked once past it
    models = [
        model(name, input_shape=[4], lines=f"silent_topic_warn_s = {warn_s}")
        for name, warn_s in (("blind", BLIND_WARN_S), ("fed", FED_WARN_S))
    ]
    server = LivefitProcess(learner_config(url, tmp_path / "data", "acl", *models), tmp_path)
    publisher = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    publisher.username_pw_set("publisher", USERS["publisher"])
    with server.start():
        publisher.connect("127.0.0.1", acl_broker.port)
        publisher.loop_start()
        try:
            published_at = time.monotonic()
            x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
            payload = encode_samples(x, x[:, :1], fmt="msgpack", batched=True)
            for name in ("blind", "fed"):  # both accepted by the broker (the publisher may write)
                info = publisher.publish(f"livefit/{name}/samples", payload, qos=1)
                info.wait_for_publish(10)
                assert info.is_published()
            assert server.wait_for_metric("livefit_train_samples_total", 50, model="fed") == 50
            warning = _wait_for_line(server, "no message on livefit/blind/samples", 30)
        finally:
            publisher.disconnect()
            publisher.loop_stop()
        assert "model blind" in warning and "ACL" in warning and "'learner'" in warning
        assert server.metric("livefit_train_samples_total", model="blind") == 0
        assert server.metric("livefit_ingest_seconds_since_message", model="blind") >= 2
        fed_silent_s = server.metric("livefit_ingest_seconds_since_message", model="fed")
        assert fed_silent_s <= time.monotonic() - published_at  # since its message, not before
        time.sleep(max(0.0, published_at + FED_WARN_S + 1 - time.monotonic()))  # past its window
        assert server.stop() == 0
    assert "no message on livefit/fed/samples" not in server.log.read_text()


def _wait_for_line(server: LivefitProcess, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in server.log.read_text(errors="replace").splitlines():
            if text in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"no log line with {text!r} in {timeout_s:g} s:\n{server.tail()}")


def test_a_refused_subscription_is_an_error_naming_the_topic(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Brokers other than mosquitto refuse a forbidden subscription in the SUBACK (0x87 in
    MQTT 5, 0x80 in 3.1.1): said at once, naming the topic and the user."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from livefit.server.base.metrics import Metrics
    from livefit.server.config.broker_urls import parse_broker_url
    from livefit.server.config.sections import BrokerSettings
    from livefit.server.mqtt.connection import MqttConnection

    address = parse_broker_url("mqtt://learner:pw@127.0.0.1:1")
    connection = MqttConnection(address, BrokerSettings(), Metrics(), client_id="suback")
    connection._pending_subscriptions.update({7: "livefit/a/samples", 8: "livefit/a/labels"})
    granted = ReasonCode(PacketTypes.SUBACK, identifier=1)
    refused = ReasonCode(PacketTypes.SUBACK, "Not authorized")
    with caplog.at_level("ERROR"):
        connection._on_subscribe(connection._client, None, 8, [granted], None)
        assert not caplog.records
        connection._on_subscribe(connection._client, None, 7, [refused], None)
    (record,) = caplog.records
    assert "refused the subscription to livefit/a/samples (Not authorized)" in record.getMessage()
    assert "'learner'" in record.getMessage()
