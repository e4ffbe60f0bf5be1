"""The sample publisher against a real mosquitto, read back by a plain paho subscriber:
``SamplePublisher`` (every sample in order, the window, QoS 0, a silent broker, the rate) and
``livefit publish`` (in this process, and as a user runs it against a real ``livefit serve``
and against a broker that speaks only MQTT 3.1.1). Encoding, sources and the command's
options: ``tests/unit/clients/``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from livefit.clients import publish
from livefit.clients.publish_results import PublishTimeout
from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.wire.formats import FORMATS
from tests.unit.clients.test_payloads import array_of
from tests.unit.clients.test_publish import cli_args

# ---------------------------------------------------------------------------------------------
# A plain paho subscriber that records what arrives.


@dataclass
class Received:
    """Payloads and ContentType properties of the messages one subscriber got, in order."""

    payloads: list[bytes] = field(default_factory=list)
    content_types: list[str | None] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.payloads) >= count, timeout_s)
        assert len(self.payloads) == count

    def documents(self) -> list[dict[str, Any]]:
        return [_decode(payload) for payload in self.payloads]


def _decode(payload: bytes) -> dict[str, Any]:
    if payload[:1] == b"{":
        return json.loads(payload)
    return msgpack.unpackb(payload, raw=False)


@contextmanager
def subscribed(broker: Mosquitto, topic: str) -> Iterator[Received]:
    """Subscribe (QoS 1) and wait for the SUBACK, so nothing published afterwards is missed."""
    received = Received()
    ready = threading.Event()

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        content_type = getattr(message.properties, "ContentType", None)
        with received.arrived:
            received.payloads.append(bytes(message.payload))
            received.content_types.append(content_type)
            received.arrived.notify_all()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(topic, qos=1)
    client.on_subscribe = lambda *_: ready.set()
    client.on_message = on_message
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        assert ready.wait(10), "no SUBACK"
        yield received
    finally:
        client.disconnect()
        client.loop_stop()


def _topic() -> str:
    return f"test/publish/{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------------
# SamplePublisher against mosquitto


@pytest.mark.parametrize(
    ("fmt", "raw", "batch", "protocol"),
    [
        ("msgpack", False, 1, "5"),
        ("json", False, 1, "5"),
        ("json", False, 64, "5"),
        ("msgpack", True, 50, "5"),
        ("msgpack", True, 1, "3.1.1"),
    ],
)
def test_publisher_delivers_every_sample_in_order(
    broker: Mosquitto, fmt: str, raw: bool, batch: int, protocol: str
) -> None:
    topic, count = _topic(), 600
    x, y = LinearStream(4, output_dim=2, seed=4).sample(count)
    before = time.time()
    with subscribed(broker, topic) as received:
        with SamplePublisher(
            broker.url, topic, fmt=fmt, raw=raw, source="unit", protocol=protocol
        ) as pub:
            stats = pub.publish_stream([(x[:250], y[:250]), (x[250:], y[250:])], batch=batch)
        messages = sum(-(-n // batch) for n in (250, 350))
        received.wait_for(messages)
    assert (stats.samples, stats.messages, stats.rejected, stats.dropped) == (count, messages, 0, 0)
    documents = received.documents()
    assert [d["seq"] for d in documents] == list(range(messages))
    assert {d["source"] for d in documents} == {"unit"}
    stamps = [d["ts"] for d in documents]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= time.time()
    expected_type = FORMATS[fmt].content_type if protocol == "5" else None
    assert set(received.content_types) == {expected_type}
    got_x = [array_of(d["x"]) for d in documents]
    got_y = [array_of(d["y"]) for d in documents]
    if batch == 1:
        got_x, got_y = [a[None] for a in got_x], [a[None] for a in got_y]
    np.testing.assert_array_equal(np.concatenate(got_x), x)
    np.testing.assert_array_equal(np.concatenate(got_y), y)


def test_qos0_messages_count_as_in_flight_until_written(broker: Mosquitto) -> None:
    topic = _topic()
    with subscribed(broker, topic) as received, SamplePublisher(broker.url, topic, qos=0) as pub:
        stats = pub.publish_stream([LinearStream(3).sample(400)], batch=4)
        assert pub.in_flight == 0
        received.wait_for(100)
    assert (stats.messages, stats.dropped) == (100, 0)
    assert [d["seq"] for d in received.documents()] == list(range(100))


def test_window_bounds_the_messages_in_flight(broker: Mosquitto) -> None:
    topic, window = _topic(), 5
    unacked_before_publish: list[int] = []
    with (
        subscribed(broker, topic) as received,
        SamplePublisher(broker.url, topic, window=window) as pub,
    ):
        client = pub.client
        real_publish, real_on_publish = client.publish, client.on_publish

        def spy_publish(*args: Any, **kwargs: Any) -> mqtt.MQTTMessageInfo:
            # paho's own table of unacknowledged QoS 1 messages, not our counter.
            unacked_before_publish.append(len(client._out_messages))
            return real_publish(*args, **kwargs)

        def slow_on_publish(*args: Any) -> None:
            time.sleep(0.001)  # acks slower than publishing, so the window fills
            real_on_publish(*args)

        client.publish = spy_publish
        client.on_publish = slow_on_publish
        stats = pub.publish_stream([LinearStream(3).sample(300)])
        assert pub.in_flight == 0
        received.wait_for(300)
    assert stats.messages == 300
    assert max(unacked_before_publish) == window - 1
    assert pub.max_in_flight == window


def test_window_respects_the_brokers_receive_maximum(tmp_path: Path) -> None:
    small = Mosquitto(tmp_path / "mosquitto", extra_config="max_inflight_messages 3\n")
    small.start()
    try:
        with SamplePublisher(small.url, _topic(), window=1000) as pub:
            stats = pub.publish_stream([LinearStream(3).sample(300)])
    finally:
        small.stop()
    assert stats.messages == 300 and pub.max_in_flight <= 3


def test_a_silent_broker_times_out_instead_of_hanging(own_broker: Mosquitto) -> None:
    assert own_broker.process is not None
    pub = SamplePublisher(own_broker.url, _topic(), window=10, ack_timeout_s=0.5)
    pub.connect()
    own_broker.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(PublishTimeout, match="no PUBACK"):
            pub.publish_stream([LinearStream(3).sample(50)])
    finally:
        own_broker.process.send_signal(signal.SIGCONT)
        pub.close()


def test_rate_limit_paces_samples(broker: Mosquitto) -> None:
    with SamplePublisher(broker.url, _topic()) as pub:
        stats = pub.publish_stream([LinearStream(3).sample(301)], batch=10, rate=1000.0)
    # The last message (samples 300..301) is due 0.3 s after the first one.
    assert stats.messages == 31 and stats.seconds >= 0.3


# ---------------------------------------------------------------------------------------------
# `livefit publish`


def test_run_publishes_a_synthetic_stream(
    broker: Mosquitto, capsys: pytest.CaptureFixture[str]
) -> None:
    with subscribed(broker, "livefit/lstm/samples") as received:
        argv = (
            "--broker",
            broker.url,
            "--model",
            "lstm",
            "--input-shape",
            "20,3",
            "--count",
            "1000",
        )
        code = publish.run(
            cli_args(
                *argv, "--batch", "100", "--raw", "--source-id", "cli", "--no-progress", "--anyway"
            )  # no learner here: the stream alone is the subject
        )
        received.wait_for(10)
    assert code == 0
    first = received.documents()[0]
    assert array_of(first["x"]).shape == (100, 20, 3) and first["source"] == "cli"
    out = capsys.readouterr().out
    assert "published 1000 samples in 10 messages" in out and "samples/s" in out


def test_run_cycles_a_file_to_reach_count(broker: Mosquitto, tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b,y\n1,2,3\n4,5,6\n")
    topic = _topic()
    with subscribed(broker, topic) as received:
        code = publish.run(cli_args("--broker", broker.url, "--topic", topic, "--source", str(path),
                                 "--count", "5", "--format", "json", "--no-progress",
                                 "--anyway"))  # fmt: skip
        received.wait_for(5)
    assert code == 0
    assert [d["y"] for d in received.documents()] == [[3.0], [6.0], [3.0], [6.0], [3.0]]


# ---------------------------------------------------------------------------------------------
# What the learner says: `livefit publish` as a user runs it, against a real `livefit serve`.

CHECKED_LEARNER = """
[broker]
url = "{url}"
client_id = "publish-check-{model}"
session_expiry_s = 0
[storage]
dir = "{storage}"
wal = false
[models.{model}]
builder = "linear"
input_shape = [8]
output_shape = [1]
"""


def livefit_publish(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "livefit", "publish", "--no-progress", *argv],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_publish_reports_rejections_and_publishes_nothing_when_no_learner_listens(
    broker: Mosquitto, tmp_path: Path
) -> None:
    model = f"checked-{uuid.uuid4().hex[:8]}"
    config = CHECKED_LEARNER.format(url=broker.url, model=model, storage=tmp_path / "data")
    server = LivefitProcess(config, tmp_path).start()
    try:
        common = ("--broker", broker.url, "--model", model, "--count", "20", "--batch", "5")
        wrong = livefit_publish(*common, "--input-shape", "3")
        assert wrong.returncode == 1, wrong.stderr
        assert "published 20 samples in 4 messages" in wrong.stdout
        assert "the learner rejected every message (4 of 4), the first for " in wrong.stderr
        assert f"(reports on livefit/{model}/rejected)" in wrong.stderr
        assert "[8]" in wrong.stderr, wrong.stderr  # the learner's detail: the expected shape

        right = livefit_publish(*common, "--input-shape", "8")
        assert right.returncode == 0, right.stderr
        assert "warning" not in right.stderr and "error" not in right.stderr
        check_a_model_nobody_serves(broker, f"{model}-nobody")
    finally:
        server.stop()


def check_a_model_nobody_serves(broker: Mosquitto, model: str) -> None:
    """A typo in ``--model`` beside a running learner (``sensr`` for ``sensor``) used to
    print "published 200 samples" and exit 0, the samples lost (issue 45): now nothing is
    published and the exit status is 1, unless ``--anyway``."""
    arrived: list[bytes] = []
    listener = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    listener.on_message = lambda _c, _u, message: arrived.append(message.payload)
    listener.connect("127.0.0.1", broker.port)
    listener.subscribe(f"livefit/{model}/samples", qos=1)
    listener.loop_start()
    try:
        time.sleep(0.5)
        nobody = livefit_publish("--broker", broker.url, "--model", model, "--count", "5")
        assert nobody.returncode == 1, nobody.stderr
        assert f"error: no learner seems to serve model '{model}'" in nobody.stderr
        assert f"(no weights on livefit/{model}/weights): nothing published" in nobody.stderr
        assert "--anyway publishes all the same" in nobody.stderr
        assert "published" not in nobody.stdout
        time.sleep(0.5)
        assert arrived == [], "not one sample was published"

        anyway = livefit_publish("--broker", broker.url, "--model", model, "--count", "5",
                                 "--anyway")  # fmt: skip
        assert anyway.returncode == 0, anyway.stderr
        assert "published 5 samples" in anyway.stdout
        assert f"warning: no learner seems to serve model '{model}'" in anyway.stderr
        assert f"livefit/{model}/weights and no rejection reports" in anyway.stderr

        unchecked = livefit_publish("--broker", broker.url, "--model", model, "--count", "5",
                                    "--no-check")  # fmt: skip
        assert unchecked.returncode == 0 and "warning" not in unchecked.stderr
        deadline = time.monotonic() + 10
        while len(arrived) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(arrived) == 10, "--anyway and --no-check published their 5 each"
    finally:
        listener.disconnect()
        listener.loop_stop()


def test_run_speaks_mqtt_311_to_a_broker_that_speaks_only_that(
    amqtt_broker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The embedded amqtt refuses MQTT 5: by default publish falls back to 3.1.1, as the
    learner does; asked for 5, it says why it cannot and what to pass."""
    argv = ("--broker", amqtt_broker, "--count", "100", "--no-check", "--no-progress")
    assert publish.run(cli_args(*argv)) == 0
    assert "published 100 samples" in capsys.readouterr().out
    assert publish.run(cli_args(*argv, "--mqtt-version", "5")) == 1
    err = capsys.readouterr().err
    assert "refused us: Unsupported protocol version" in err and "--mqtt-version 3.1.1" in err
