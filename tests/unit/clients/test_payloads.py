"""Sample payload encoding (``clients.payloads``): JSON, msgpack and raw buffers round-trip, the
encoder refuses what the server rejects, and the server's codec decodes what it encodes."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np
import pytest

from livefit.clients.payloads import encode_samples
from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import SequenceStream
from livefit.server.wire.codec import SampleSpec, decode_message
from livefit.server.wire.formats import FORMATS


def array_of(value: Any) -> np.ndarray:
    """A decoded x, y or w as float32, whether nested lists or a raw buffer."""
    if isinstance(value, dict):
        data = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
        return data.reshape(value["shape"]).astype(np.float32)
    return np.asarray(value, dtype=np.float32)


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
