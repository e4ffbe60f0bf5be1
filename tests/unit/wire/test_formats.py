"""The payload format registry: every format round-trips, an unlabelled payload is told by its
first byte exactly as before the registry, raw buffers need a binary format, and a format
registered here is read and written everywhere without another line of code."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest

from livefit.clients.payloads import encode_samples
from livefit.clients.publish_args import add_arguments
from livefit.server.wire.codec import SampleSpec, decode_message
from livefit.server.wire.formats import (
    FORMATS,
    JSON,
    MSGPACK,
    RAW_DTYPES,
    WireFormat,
    format_named,
    format_of,
    raw_buffer,
    register,
)
from livefit.server.wire.labels import decode_labels
from livefit.server.wire.rejection import Rejection

SPEC = SampleSpec(input_shape=(3,), target_shape=(1,))
DOCUMENT = {"x": [[1.5, -2.0, 0.0]], "y": [[3.25]], "id": "a-1", "seq": 7, "ts": 12.5}


def rejected(payload: bytes, content_type: str | None = None) -> str:
    with pytest.raises(Rejection) as caught:
        format_of(payload, content_type)
    assert caught.value.reason == "undecodable"
    return caught.value.detail


# --- every format ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_round_trips_a_document(name: str) -> None:
    wire_format = FORMATS[name]
    assert wire_format.decode(wire_format.encode(DOCUMENT)) == DOCUMENT


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_round_trips_samples_labelled_and_unlabelled(name: str) -> None:
    """What a publisher encodes in a format the codec decodes, by its content type or sniffed."""
    x = np.array([[1.5, -2.0, 0.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    y = np.array([[1.0], [2.0]], dtype=np.float32)
    payload = encode_samples(x, y, fmt=name, batched=True, seq=3)
    for content_type in (FORMATS[name].content_type, None):
        decoded = decode_message(payload, SPEC, content_type)
        np.testing.assert_array_equal(decoded.chunk.x, x)
        np.testing.assert_array_equal(decoded.chunk.y, y)
        assert decoded.seq == 3


@pytest.mark.parametrize("name", sorted(f.name for f in FORMATS.values() if f.binary))
def test_every_binary_format_round_trips_raw_buffers(name: str) -> None:
    x = np.arange(6, dtype="<f8").reshape(2, 3)
    payload = encode_samples(x, np.array([1.0, 2.0]), fmt=name, batched=True, raw=True)
    decoded = decode_message(payload, SPEC, FORMATS[name].content_type)
    np.testing.assert_array_equal(decoded.chunk.x, x.astype(np.float32))


def test_the_publisher_content_type_is_one_the_server_accepts() -> None:
    for wire_format in FORMATS.values():
        assert wire_format.content_type in wire_format.accepted_types
        assert format_of(b"", wire_format.content_type) is wire_format


# --- sniffing ----------------------------------------------------------------------------------


def old_rule(payload: bytes) -> str:
    """The codec's rule before the registry, kept here to hold the registry to it."""
    head = payload.lstrip()[:1]
    if head in (b"{", b"["):
        return "json"
    if head and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return "msgpack"
    return "rejected"


@pytest.mark.parametrize("lead", [b"", b" ", b"\t\r\n "])
def test_every_first_byte_is_told_as_before(lead: bytes) -> None:
    for byte in range(256):
        payload = lead + bytes([byte]) + b"rest"
        try:
            told = format_of(payload, None).name
        except Rejection:
            told = "rejected"
        assert told == old_rule(payload), (lead, byte)


def test_an_empty_or_blank_payload_is_said_to_be_empty() -> None:
    assert rejected(b"") == "empty payload"
    assert rejected(b" \n\t ") == "empty payload"


def test_a_payload_of_no_format_names_every_format() -> None:
    assert rejected(b"\x00\x01 not json") == "payload is neither a JSON object nor a msgpack map"


@pytest.mark.parametrize(
    "content_type, expected",
    [
        ("application/json", JSON),
        ("text/json", JSON),
        ("Application/JSON; charset=utf-8", JSON),
        ("application/msgpack", MSGPACK),
        ("application/x-msgpack", MSGPACK),
        (" application/vnd.msgpack ;v=1", MSGPACK),
    ],
)
def test_a_content_type_a_format_accepts_wins_over_the_first_byte(
    content_type: str, expected: WireFormat
) -> None:
    other = MSGPACK if expected is JSON else JSON
    payload = other.encode({"x": 1})
    assert format_of(payload, content_type) is expected


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream", ""])
def test_a_content_type_no_format_accepts_leaves_the_payload_sniffed(content_type: str) -> None:
    assert format_of(b' {"x": 1}', content_type) is JSON
    assert format_of(msgpack.packb({"x": 1}), content_type) is MSGPACK


def test_a_labelled_payload_invalid_in_its_format_says_which() -> None:
    with pytest.raises(Rejection, match="invalid msgpack"):
        decode_message(b'{"x": [1, 2, 3], "y": [1]}', SPEC, "application/msgpack")


# --- raw buffers -------------------------------------------------------------------------------


def test_raw_buffers_need_a_binary_format() -> None:
    assert format_named("msgpack", raw=True) is MSGPACK
    assert format_named("json") is JSON
    with pytest.raises(ValueError) as caught:
        format_named("json", raw=True)
    assert str(caught.value) == "raw buffers need a binary format (msgpack); json has no bytes type"


def test_an_unknown_format_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"format must be one of \['json', 'msgpack'\], got 'xml'"):
        format_named("xml")


@pytest.mark.parametrize("dtype", [">f4", "<f8", "<i4", "|u1", "<u4", "float16"])
def test_a_raw_buffer_is_little_endian_in_a_dtype_the_server_takes(dtype: str) -> None:
    array = np.arange(6).reshape(2, 3).astype(dtype)
    buffer = raw_buffer(array)
    assert buffer["dtype"] in RAW_DTYPES and buffer["shape"] == [2, 3]
    back = np.frombuffer(buffer["data"], np.dtype(buffer["dtype"])).reshape(buffer["shape"])
    np.testing.assert_array_equal(back, array)


# --- one entry suffices ------------------------------------------------------------------------

TAG = 0xC1  # the one byte msgpack never uses


def _tagged_decode(payload: bytes) -> object:
    if payload[:1] != bytes([TAG]):
        raise ValueError("no tag")
    return msgpack.unpackb(payload[1:], raw=False, strict_map_key=False)


def _tagged_encode(document: object) -> bytes:
    return bytes([TAG]) + msgpack.packb(document, use_bin_type=True)


TAGGED = WireFormat(
    name="tagged",
    content_type="application/x-tagged",
    accepted_types=("application/x-tagged",),
    lead_bytes=frozenset([TAG]),
    describes="a tagged map",
    decode=_tagged_decode,
    encode=_tagged_encode,
    binary=True,
)


@pytest.fixture
def tagged() -> Iterator[WireFormat]:
    register(TAGGED)
    try:
        yield TAGGED
    finally:
        del FORMATS[TAGGED.name]


def test_a_registered_format_is_written_and_read_everywhere(tagged: WireFormat) -> None:
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    payload = encode_samples(x, np.array([[4.0]]), fmt="tagged", batched=True, raw=True)
    assert payload[0] == TAG
    for content_type in ("application/x-tagged", None):
        np.testing.assert_array_equal(decode_message(payload, SPEC, content_type).chunk.x, x)
    labels = decode_labels(tagged.encode({"id": "r1", "y": [0.5]}), SPEC)
    assert labels.ids == ["r1"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--format", "tagged"]).fmt == "tagged"
    assert rejected(b"\x00") == (
        "payload is neither a JSON object nor a msgpack map nor a tagged map"
    )
    with pytest.raises(Rejection, match="invalid tagged: no tag"):
        decode_message(b"{}", SPEC, "application/x-tagged")


@pytest.mark.parametrize(
    "clash",
    [
        {"name": "json"},
        {"accepted_types": ("application/x-tagged", "text/json")},
        {"lead_bytes": frozenset([TAG, 0x80])},
    ],
)
def test_a_format_that_would_make_a_payload_ambiguous_is_refused(clash: dict) -> None:
    fields = {f: getattr(TAGGED, f) for f in TAGGED.__dataclass_fields__}
    with pytest.raises(ValueError, match="clashes with"):
        register(WireFormat(**{**fields, **clash}))
    assert set(FORMATS) == {"json", "msgpack"}
