"""The sample publisher: payload encoding, synthetic and file sources, and SamplePublisher and
`livefit publish` against a real mosquitto, read back by a plain paho subscriber."""

from __future__ import annotations

import argparse
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
from livefit.clients.pacing import RatePacer
from livefit.clients.payloads import encode_samples
from livefit.clients.publish_args import add_arguments, parse_shape
from livefit.clients.publish_results import PublishTimeout
from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream, SequenceStream, cycle_chunks, load_file
from livefit.local_servers import LivefitProcess
from livefit.server.mqtt.broker import BrokerAddress, parse_broker_url
from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.wire.codec import SampleSpec, decode_message
from livefit.server.wire.encoding import CONTENT_TYPES

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


def _array(value: Any) -> np.ndarray:
    """A decoded x, y or w as float32, whether nested lists or a raw buffer."""
    if isinstance(value, dict):
        data = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
        return data.reshape(value["shape"]).astype(np.float32)
    return np.asarray(value, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# encode_samples


def test_json_single_sample_round_trips_with_metadata() -> None:
    x, y = np.array([0.5, -1.25, 3.0], dtype=np.float32), np.array([2.0], dtype=np.float32)
    payload = encode_samples(
        x, y, fmt="json", batched=False, w=0.5, ts=12.5, source="s", seq=7, id="a"
    )
    document = json.loads(payload)
    assert document == {
        "x": [0.5, -1.25, 3.0],
        "y": [2.0],
        "w": 0.5,
        "id": "a",
        "ts": 12.5,
        "source": "s",
        "seq": 7,
    }


def test_msgpack_batch_round_trips_and_omits_unset_fields() -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2) / 7
    y = np.arange(4, dtype=np.float32).reshape(4, 1)
    document = msgpack.unpackb(encode_samples(x, y, fmt="msgpack", batched=True, w=2.0))
    assert set(document) == {"x", "y", "w"}
    np.testing.assert_array_equal(_array(document["x"]), x)
    np.testing.assert_array_equal(_array(document["y"]), y)
    assert document["w"] == [2.0, 2.0, 2.0, 2.0]


@pytest.mark.parametrize("dtype", [">f4", "<f8", "<i4", "<i8", "|u1"])
def test_raw_buffers_are_little_endian_c_order(dtype: str) -> None:
    x = np.asfortranarray(np.arange(6).reshape(2, 3)).astype(dtype)
    y = np.array([1.5, 2.5])
    document = msgpack.unpackb(
        encode_samples(x, y, fmt="msgpack", batched=True, raw=True, w=np.array([1.0, 0.0]))
    )
    raw_x = document["x"]
    assert raw_x["dtype"] == np.dtype(dtype).newbyteorder("<").str
    assert raw_x["shape"] == [2, 3]
    assert raw_x["data"] == np.ascontiguousarray(x, dtype=raw_x["dtype"]).tobytes()
    np.testing.assert_array_equal(_array(raw_x), x.astype(np.float32))
    assert document["y"]["dtype"] == "<f8"
    np.testing.assert_array_equal(_array(document["w"]), [1.0, 0.0])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"x": [np.nan, 1.0], "fmt": "json"}, ValueError),
        ({"x": [np.inf, 1.0], "fmt": "msgpack"}, ValueError),
        ({"x": np.array(["a", "b"]), "fmt": "msgpack"}, TypeError),
        ({"fmt": "json", "raw": True}, ValueError),
        ({"w": -1.0}, ValueError),
        ({"w": [1.0, 1.0]}, ValueError),
    ],
)
def test_encode_refuses_what_the_server_rejects(kwargs: dict[str, Any], error: type) -> None:
    arguments: dict[str, Any] = {"x": [0.0, 1.0], "y": [1.0], "fmt": "msgpack", **kwargs}
    with pytest.raises(error):
        encode_samples(
            np.asarray(arguments.pop("x")),
            np.asarray(arguments.pop("y")),
            **arguments,
            batched=False,
        )


def test_batch_with_mismatched_lengths_is_refused() -> None:
    with pytest.raises(ValueError, match="same leading length"):
        encode_samples(np.zeros((3, 2)), np.zeros((2, 1)), fmt="json", batched=True)


@pytest.mark.parametrize(
    ("fmt", "raw", "batched"),
    [
        ("json", False, False),
        ("json", False, True),
        ("msgpack", False, True),
        ("msgpack", True, True),
        ("msgpack", True, False),
    ],
)
def test_server_codec_decodes_what_we_encode(fmt: str, raw: bool, batched: bool) -> None:
    """Contract check against server/wire/codec.py: same samples, weights and identifiers."""
    stream = SequenceStream(5, 3, output_dim=2, seed=3)
    x, y = stream.sample(4)
    w = np.array([1.0, 0.5, 0.0, 2.0], dtype=np.float32)
    if not batched:
        x, y, w = x[:1], y[:1], w[:1]
    sent_x, sent_y, sent_w = (x, y, w) if batched else (x[0], y[0], float(w[0]))
    payload = encode_samples(
        sent_x,
        sent_y,
        fmt=fmt,
        batched=batched,
        raw=raw,
        w=sent_w,
        ts=1.5,
        source="t",
        seq=9,
    )
    decoded = decode_message(payload, SampleSpec((5, 3), (2,)), CONTENT_TYPES[fmt])
    np.testing.assert_array_equal(decoded.chunk.x, x)
    np.testing.assert_array_equal(decoded.chunk.y, y)
    np.testing.assert_array_equal(decoded.chunk.w, w)
    assert (decoded.source, decoded.seq, decoded.chunk.published_at) == ("t", 9, 1.5)


# ---------------------------------------------------------------------------------------------
# Synthetic streams and files


def test_linear_stream_is_deterministic_for_a_seed() -> None:
    first, second = LinearStream(8, seed=5), LinearStream(8, seed=5)
    for n in (1, 10, 100):
        for a, b in zip(first.sample(n), second.sample(n), strict=True):
            np.testing.assert_array_equal(a, b)
    x, y = LinearStream(8, seed=6).sample(100)
    assert not np.array_equal(y, second.sample(100)[1])
    assert (x.dtype, y.dtype, x.shape, y.shape) == (np.float32, np.float32, (100, 8), (100, 1))


def test_least_squares_recovers_the_linear_stream() -> None:
    stream = LinearStream(6, output_dim=2, noise=0.01, seed=1)
    x, y = stream.sample(4000)
    design = np.hstack([x, np.ones((len(x), 1), dtype=np.float32)])
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    # Standard error of each coefficient is noise / sqrt(n) ~ 1.6e-4; allow many of those.
    np.testing.assert_allclose(solution[:-1], stream.weights, atol=2e-3)
    np.testing.assert_allclose(solution[-1], stream.bias, atol=2e-3)
    residual = y - design @ solution
    assert 0.008 < residual.std() < 0.012


def test_sequence_stream_targets_follow_the_time_mean() -> None:
    stream = SequenceStream(20, 3, noise=0.0, seed=2)
    x, y = stream.sample(500)
    assert x.shape == (500, 20, 3) and stream.input_shape == (20, 3)
    np.testing.assert_allclose(y, x.mean(axis=1) @ stream.weights + stream.bias, atol=1e-5)
    assert 0.5 < y.std() < 2.0  # scaled to about unit variance


def test_load_csv_with_and_without_header(tmp_path: Path) -> None:
    table = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=np.float32)
    body = "\n".join(",".join(str(v) for v in row) for row in table) + "\n"
    (tmp_path / "plain.csv").write_text(body)
    (tmp_path / "header.csv").write_text("a,b,c,target\n" + body)
    for name in ("plain.csv", "header.csv"):
        x, y = load_file(tmp_path / name, target_columns=2)
        np.testing.assert_array_equal(x, table[:, :2])
        np.testing.assert_array_equal(y, table[:, 2:])
        assert x.dtype == y.dtype == np.float32


def test_load_npy_and_npz(tmp_path: Path) -> None:
    table = np.arange(15, dtype=np.float64).reshape(5, 3)
    np.save(tmp_path / "t.npy", table)
    x, y = load_file(tmp_path / "t.npy")
    np.testing.assert_array_equal(x, table[:, :2])
    np.testing.assert_array_equal(y, table[:, 2:])
    sequences, targets = np.ones((5, 4, 2)), np.arange(5.0)
    np.savez(tmp_path / "s.npz", x=sequences, y=targets)
    x, y = load_file(tmp_path / "s.npz")
    assert x.shape == (5, 4, 2) and x.dtype == np.float32
    np.testing.assert_array_equal(y, targets)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("bad.csv", "1,2\n3,oops\n", "non-numeric"),
        ("nan.csv", "1,2\nnan,3\n", "NaN or infinity"),
        ("one.csv", "1\n2\n", "at least one input column"),
        ("empty.csv", "a,b\n", "no samples"),
        ("data.txt", "1,2\n", "unsupported file type"),
    ],
)
def test_load_file_names_the_problem(tmp_path: Path, name: str, content: str, match: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match):
        load_file(tmp_path / name)


def test_npz_needs_x_and_y(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", inputs=np.ones((2, 2)))
    with pytest.raises(ValueError, match="missing arrays"):
        load_file(tmp_path / "a.npz")


def test_cycle_chunks_wraps_around_in_order() -> None:
    x, y = np.arange(5)[:, None], np.arange(5)
    chunks = list(cycle_chunks(x, y, count=12, chunk_size=4))
    assert [len(cx) for cx, _ in chunks] == [4, 4, 4]
    assert np.concatenate([cy for _, cy in chunks]).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


# ---------------------------------------------------------------------------------------------
# URL, shape and pacing helpers


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://127.0.0.1:1884", BrokerAddress("127.0.0.1", 1884)),
        ("mqtt://broker", BrokerAddress("broker", 1883)),
        (
            "mqtts://u%40x:p%3Aw@broker.example",
            BrokerAddress("broker.example", 8883, True, "u@x", "p:w"),
        ),
        ("mqtt://[::1]:1999/", BrokerAddress("::1", 1999)),
    ],
)
def test_parse_broker_url(url: str, expected: BrokerAddress) -> None:
    assert parse_broker_url(url) == expected


@pytest.mark.parametrize(
    "url", ["http://host", "127.0.0.1:1883", "mqtt://", "mqtt://h:99999", "mqtt://h/x"]
)
def test_parse_broker_url_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        parse_broker_url(url)


def test_password_never_appears_in_the_address_text() -> None:
    assert str(parse_broker_url("mqtt://me:secret@h:1")) == "mqtt://me@h:1"


def test_parse_shape() -> None:
    assert parse_shape("8") == (8,)
    assert parse_shape("[20, 3]") == (20, 3)
    for bad in ("", "a", "0", "3,-1"):
        with pytest.raises(ValueError):
            parse_shape(bad)


def test_rate_pacer_schedules_against_the_start() -> None:
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds + 0.003  # every sleep overshoots; the schedule must absorb it

    pacer = RatePacer(1000.0, clock=lambda: now[0], sleep=sleep)
    for sent in range(0, 500, 50):  # messages of 50 samples
        pacer.wait(sent)
    assert sleeps[0] == pytest.approx(0.05)
    assert now[0] == pytest.approx(100.45 + 0.003)  # the last message is due at 450 / 1000 s


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
    expected_type = CONTENT_TYPES[fmt] if protocol == "5" else None
    assert set(received.content_types) == {expected_type}
    got_x = [_array(d["x"]) for d in documents]
    got_y = [_array(d["y"]) for d in documents]
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


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="livefit publish")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_match_the_bundled_demo() -> None:
    args = _args()
    assert (args.broker, args.model, args.fmt, args.batch, args.qos) == (
        "mqtt://127.0.0.1:1883",
        "demo",
        "msgpack",
        1,
        1,
    )
    assert (args.count, args.rate, args.window, args.input_shape) == (None, 0.0, 1000, None)


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
            _args(*argv, "--batch", "100", "--raw", "--source-id", "cli", "--no-progress")
        )
        received.wait_for(10)
    assert code == 0
    first = received.documents()[0]
    assert _array(first["x"]).shape == (100, 20, 3) and first["source"] == "cli"
    out = capsys.readouterr().out
    assert "published 1000 samples in 10 messages" in out and "samples/s" in out


def test_run_cycles_a_file_to_reach_count(broker: Mosquitto, tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b,y\n1,2,3\n4,5,6\n")
    topic = _topic()
    with subscribed(broker, topic) as received:
        code = publish.run(_args("--broker", broker.url, "--topic", topic, "--source", str(path),
                                 "--count", "5", "--format", "json", "--no-progress"))  # fmt: skip
        received.wait_for(5)
    assert code == 0
    assert [d["y"] for d in received.documents()] == [[3.0], [6.0], [3.0], [6.0], [3.0]]


def test_run_fails_fast_on_an_unreachable_broker(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    start = time.monotonic()
    code = publish.run(_args("--broker", url, "--connect-timeout", "2", "--no-progress"))
    assert code == 1 and time.monotonic() - start < 5
    assert f"cannot reach the MQTT broker at {url}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ("--broker", "http://x"),
        ("--format", "json", "--raw"),
        ("--input-shape", "2,3,4"),
        ("--source", "/nonexistent/data.csv"),
    ],
)
def test_run_rejects_bad_options_with_code_2(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert publish.run(_args(*argv)) == 2
    assert "livefit publish: error:" in capsys.readouterr().err


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


def test_publish_reports_rejections_and_warns_when_no_learner_listens(
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
    finally:
        server.stop()

    nobody = livefit_publish("--broker", broker.url, "--model", f"{model}-nobody", "--count", "5")
    assert nobody.returncode == 0, nobody.stderr
    assert f"warning: no learner seems to serve model '{model}-nobody'" in nobody.stderr
    assert f"livefit/{model}-nobody/weights" in nobody.stderr

    unchecked = livefit_publish(
        "--broker", broker.url, "--model", f"{model}-nobody", "--count", "5", "--no-check"
    )
    assert unchecked.returncode == 0 and "warning" not in unchecked.stderr


def test_run_speaks_mqtt_311_to_a_broker_that_speaks_only_that(
    amqtt_broker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The embedded amqtt refuses MQTT 5: by default publish falls back to 3.1.1, as the
    learner does; asked for 5, it says why it cannot and what to pass."""
    argv = ("--broker", amqtt_broker, "--count", "100", "--no-check", "--no-progress")
    assert publish.run(_args(*argv)) == 0
    assert "published 100 samples" in capsys.readouterr().out
    assert publish.run(_args(*argv, "--mqtt-version", "5")) == 1
    err = capsys.readouterr().err
    assert "refused us: Unsupported protocol version" in err and "--mqtt-version 3.1.1" in err
