"""The sample publisher's parts: payload encoding, synthetic and file sources, URLs, shapes
and pacing, and the options of ``livefit publish``. Against a real mosquitto (and a real
``livefit serve``): ``tests/e2e/test_publish_broker.py``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from livefit.clients import publish
from livefit.clients.pacing import RatePacer
from livefit.clients.payloads import encode_samples
from livefit.clients.publish_args import add_arguments, parse_shape
from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream, SequenceStream, cycle_chunks, load_file
from livefit.server.config.broker_urls import BrokerAddress, parse_broker_url
from livefit.server.runtime.local_process import free_port
from livefit.server.wire.codec import SampleSpec, decode_message
from livefit.server.wire.formats import FORMATS


def array_of(value: Any) -> np.ndarray:
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
    np.testing.assert_array_equal(array_of(document["x"]), x)
    np.testing.assert_array_equal(array_of(document["y"]), y)
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
    np.testing.assert_array_equal(array_of(raw_x), x.astype(np.float32))
    assert document["y"]["dtype"] == "<f8"
    np.testing.assert_array_equal(array_of(document["w"]), [1.0, 0.0])


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


def test_the_encoder_and_the_publisher_refuse_a_format_alike() -> None:
    """Both take the format from the registry (``formats.format_named``): one rule, one
    message, before anything is encoded or any connection is made."""
    for fmt, raw in (("json", True), ("xml", False)):
        with pytest.raises(ValueError) as by_encoder:
            encode_samples(np.zeros(2), np.zeros(1), fmt=fmt, batched=False, raw=raw)
        with pytest.raises(ValueError) as by_publisher:
            SamplePublisher("mqtt://127.0.0.1:1", "t", fmt=fmt, raw=raw)
        assert str(by_encoder.value) == str(by_publisher.value)
        assert ("bytes type" if raw else "must be one of") in str(by_publisher.value)


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
    decoded = decode_message(payload, SampleSpec((5, 3), (2,)), FORMATS[fmt].content_type)
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
# `livefit publish`


def cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="livefit publish")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_match_the_bundled_demo() -> None:
    args = cli_args()
    assert (args.broker, args.model, args.fmt, args.batch, args.qos) == (
        "mqtt://127.0.0.1:1883",
        "demo",
        "msgpack",
        1,
        1,
    )
    assert (args.count, args.rate, args.window, args.input_shape) == (None, 0.0, 1000, None)


def test_run_fails_fast_on_an_unreachable_broker(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    start = time.monotonic()
    code = publish.run(cli_args("--broker", url, "--connect-timeout", "2", "--no-progress"))
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
    assert publish.run(cli_args(*argv)) == 2
    assert "livefit publish: error:" in capsys.readouterr().err
