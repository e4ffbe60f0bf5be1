"""Decoding and validation of sample messages: every accepted form and every rejection reason."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from livefit.server.codec import REASONS, Rejection, SampleSpec, decode_message

SPEC = SampleSpec(input_shape=(3,), target_shape=(1,), max_message_bytes=4096, max_samples=50)
SEQ_SPEC = SampleSpec(input_shape=(4, 2), target_shape=(2,))
SPARSE_SPEC = SampleSpec(input_shape=(3,), target_shape=())


def js(document: object) -> bytes:
    return json.dumps(document).encode()


def mp(document: object) -> bytes:
    return msgpack.packb(document)


def raw(array: np.ndarray) -> dict[str, object]:
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": array.tobytes()}


@pytest.mark.parametrize("encode", [js, mp])
def test_single_sample(encode) -> None:
    decoded = decode_message(encode({"x": [1, 2, 3], "y": [0.5], "ts": 12.5, "seq": 7}), SPEC)
    chunk = decoded.chunk
    assert chunk.x.shape == (1, 3) and chunk.x.dtype == np.float32
    assert chunk.y.shape == (1, 1) and chunk.y[0, 0] == 0.5
    assert chunk.w.tolist() == [1.0]
    assert chunk.published_at == 12.5 and decoded.seq == 7


@pytest.mark.parametrize("encode", [js, mp])
def test_batch_with_weights_and_ids(encode) -> None:
    document = {
        "x": [[1, 2, 3], [4, 5, 6]],
        "y": [[1], [2]],
        "w": [0.5, 2],
        "id": "abc",
        "source": "sensor-1",
    }
    decoded = decode_message(encode(document), SPEC)
    assert decoded.chunk.x.shape == (2, 3)
    assert decoded.chunk.w.tolist() == [0.5, 2.0]
    assert (decoded.id, decoded.source) == ("abc", "sensor-1")


def test_scalar_targets_are_accepted_for_one_output() -> None:
    assert decode_message(js({"x": [1, 2, 3], "y": 4.0}), SPEC).chunk.y.shape == (1, 1)
    batch = decode_message(js({"x": [[1, 2, 3]] * 3, "y": [1, 2, 3]}), SPEC)
    assert batch.chunk.y.shape == (3, 1)


def test_sparse_class_targets() -> None:
    assert decode_message(js({"x": [1, 2, 3], "y": 2}), SPARSE_SPEC).chunk.y.shape == (1,)
    assert decode_message(js({"x": [[1, 2, 3]] * 2, "y": [0, 1]}), SPARSE_SPEC).chunk.y.shape == (
        2,
    )


def test_sequence_inputs_single_and_batch() -> None:
    one = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert decode_message(js({"x": one.tolist(), "y": [1, 2]}), SEQ_SPEC).chunk.x.shape == (1, 4, 2)
    many = np.stack([one, one, one])
    decoded = decode_message(js({"x": many.tolist(), "y": [[1, 2]] * 3}), SEQ_SPEC)
    assert decoded.chunk.x.shape == (3, 4, 2)


def test_msgpack_raw_buffers() -> None:
    x = np.arange(12, dtype="<f8").reshape(4, 3)
    y = np.arange(4, dtype="<i4").reshape(4, 1)
    decoded = decode_message(mp({"x": raw(x), "y": raw(y), "w": raw(np.ones(4, "<f4"))}), SPEC)
    np.testing.assert_array_equal(decoded.chunk.x, x.astype(np.float32))
    np.testing.assert_array_equal(decoded.chunk.y, y.astype(np.float32))


def test_content_type_overrides_sniffing() -> None:
    payload = js({"x": [1, 2, 3], "y": [1]})
    assert decode_message(payload, SPEC, "application/json").chunk.x.shape == (1, 3)
    with pytest.raises(Rejection) as caught:
        decode_message(payload, SPEC, "application/msgpack")
    assert caught.value.reason == "undecodable"


BAD_MESSAGES = {
    "too_large": js({"x": [1, 2, 3], "y": [1], "pad": "a" * 5000}),
    "undecodable": b"\x00\x01 not json",
    "bad_schema": js({"x": [1, 2, 3]}),
    "bad_shape": js({"x": [1, 2], "y": [1]}),
    "non_numeric": js({"x": ["a", "b", "c"], "y": [1]}),
    "non_finite": js({"x": [1, float("nan"), 3], "y": [1]}),
    "length_mismatch": js({"x": [[1, 2, 3], [4, 5, 6]], "y": [[1], [2], [3]]}),
    "bad_weight": js({"x": [[1, 2, 3], [4, 5, 6]], "y": [[1], [2]], "w": [1, -1]}),
    "too_many_samples": mp({"x": [[1, 2, 3]] * 51, "y": [[1]] * 51}),
}


@pytest.mark.parametrize("reason", REASONS)
def test_every_rejection_reason(reason: str) -> None:
    with pytest.raises(Rejection) as caught:
        decode_message(BAD_MESSAGES[reason], SPEC)
    assert caught.value.reason == reason
    assert caught.value.detail


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "undecodable"),
        (b"{not json", "undecodable"),
        (b"[1, 2, 3]", "bad_schema"),
        (js({"x": [[1, 2, 3], [1, 2]], "y": [[1], [2]]}), "bad_shape"),
        (js({"x": [1, 2, 3], "y": [1, 2]}), "bad_shape"),
        (js({"x": [True, False, True], "y": [1]}), "non_numeric"),
        (js({"x": None, "y": [1]}), "non_numeric"),
        (js({"x": [1, 2, 3], "y": [1e39]}), "non_finite"),
        (js({"x": [1, 2, 3], "y": [1], "w": "heavy"}), "bad_weight"),
        (js({"x": [1, 2, 3], "y": [1], "ts": "yesterday"}), "bad_schema"),
        (js({"x": [1, 2, 3], "y": [1], "seq": 1.5}), "bad_schema"),
        (js({"x": [], "y": []}), "bad_shape"),
        (mp({"x": {"dtype": "<f4", "shape": [1, 3], "data": b"\x00" * 11}, "y": [1]}), "bad_shape"),
        (mp({"x": {"dtype": "object", "shape": [3], "data": b""}, "y": [1]}), "bad_schema"),
        (js({"x": [[[[[[1]]]]]], "y": [1]}), "bad_shape"),
        ("[" * 100_000, "undecodable"),
    ],
)
def test_more_rejections(payload: bytes | str, reason: str) -> None:
    data = payload.encode() if isinstance(payload, str) else payload
    spec = SampleSpec(input_shape=(3,), target_shape=(1,), max_message_bytes=1 << 20)
    with pytest.raises(Rejection) as caught:
        decode_message(data, spec)
    assert caught.value.reason == reason, caught.value.detail
