"""Decoding and validation of sample messages: every accepted form and every rejection reason."""

from __future__ import annotations

import json
import warnings

import msgpack
import numpy as np
import pytest

from livefit.clients.payloads import encode_samples
from livefit.server.wire import codec
from livefit.server.wire.codec import SampleSpec, decode_message
from livefit.server.wire.formats import FORMATS, RAW_DTYPES
from livefit.server.wire.rejection import REASONS, Rejection

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


def test_every_reason_has_an_example() -> None:
    assert set(BAD_MESSAGES) | {"internal"} == set(REASONS)  # internal: see the guard test


@pytest.mark.parametrize("reason", sorted(BAD_MESSAGES))
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


def raw_dict(dtype: object, shape: object, data: object) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data": data}


# Each of these raised something other than Rejection (OverflowError, ValueError, TypeError),
# was accepted although it is not a number, or named the wrong reason.
HOSTILE = {
    "ts_401_digits": (js({"x": [1, 2, 3], "y": [1], "ts": 10**400}), "bad_schema"),
    "ts_minus_401_digits": (js({"x": [1, 2, 3], "y": [1], "ts": -(10**400)}), "bad_schema"),
    "ts_1e308": (b'{"x": [1, 2, 3], "y": [1], "ts": 1e308}', "bad_schema"),
    "ts_negative": (b'{"x": [1, 2, 3], "y": [1], "ts": -1}', "bad_schema"),
    "ts_nan": (b'{"x": [1, 2, 3], "y": [1], "ts": NaN}', "bad_schema"),
    "seq_401_digits": (js({"x": [1, 2, 3], "y": [1], "seq": 10**400}), "bad_schema"),
    "seq_uint64_max": (mp({"x": [1, 2, 3], "y": [1], "seq": 2**64 - 1}), "bad_schema"),
    "seq_negative": (mp({"x": [1, 2, 3], "y": [1], "seq": -1}), "bad_schema"),
    "raw_shape_0_2e62_2e62": (mp({"x": raw_dict("<f4", [0, 2**62, 2**62], b""), "y": [1]}), "bad_shape"),
    "raw_shape_int64_max": (mp({"x": raw_dict("<f4", [2**63 - 1, 2**63 - 1], b""), "y": [1]}), "bad_shape"),
    "raw_rank_100": (mp({"x": raw_dict("<f4", [1] * 100, b"\0" * 4), "y": [1]}), "bad_shape"),
    "raw_rank_100_empty": (mp({"x": raw_dict("<f4", [0] * 100, b""), "y": [1]}), "bad_shape"),
    "raw_y_rank_65": (mp({"x": [1, 2, 3], "y": raw_dict("<f4", [1] * 65, b"\0" * 4)}), "bad_shape"),
    "raw_w_rank_70": (mp({"x": [1, 2, 3], "y": [1], "w": raw_dict("<f4", [1] * 70, b"\0" * 4)}), "bad_weight"),
    "raw_dtype_list": (mp({"x": raw_dict(["<f4"], [3], b"\0" * 12), "y": [1]}), "bad_schema"),
    "raw_dtype_map": (mp({"x": raw_dict({"a": 1}, [3], b"\0" * 12), "y": [1]}), "bad_schema"),
    "raw_f8_too_large_for_f32": (mp({"x": raw_dict("<f8", [3], np.full(3, 1e300).tobytes()), "y": [1]}), "non_finite"),
    "bool_in_x": (js({"x": [True, 1.0, 1.0], "y": [1]}), "non_numeric"),
    "bool_in_x_batch": (js({"x": [[1.0, 2.0, 3.0], [1.0, False, 3.0]], "y": [[1], [2]]}), "non_numeric"),
    "bool_y": (mp({"x": [1.0, 2.0, 3.0], "y": [True]}), "non_numeric"),
    "bool_in_w": (js({"x": [[1, 2, 3], [4, 5, 6]], "y": [[1], [2]], "w": [True, 1]}), "bad_weight"),
    "x_401_digits": (js({"x": [10**400, 1, 2], "y": [1]}), "non_finite"),
    "y_too_large_int": (js({"x": [1, 2, 3], "y": [-(10**39)]}), "non_finite"),
    "w_401_digits": (js({"x": [1, 2, 3], "y": [1], "w": 10**400}), "bad_weight"),
    "w_1e308": (b'{"x": [1, 2, 3], "y": [1], "w": 1e308}', "bad_weight"),
    "w_nan": (b'{"x": [1, 2, 3], "y": [1], "w": NaN}', "bad_weight"),
    "map_in_x": (js({"x": [1, 2, {"a": 3}], "y": [1]}), "non_numeric"),
    "raw_in_list": (mp({"x": [1, 2, raw_dict("<f4", [], b"\0" * 4)], "y": [1]}), "non_numeric"),
    "bin_in_x": (mp({"x": [1, 2, b"3"], "y": [1]}), "non_numeric"),
    "non_ascii_digit_string": (js({"x": [1, 2, "\u0663"], "y": [1]}), "non_numeric"),
    "non_ascii_digit_token": ('{"x": [1, 2, \u0663], "y": [1]}'.encode(), "undecodable"),
    "x_5000_digits": (b'{"x": [1, 2, ' + b"7" * 5000 + b'], "y": [1]}', "undecodable"),
    "msgpack_nested_40": (mp({"x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "y": [1]}), "bad_shape"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_values_are_rejections(case: str) -> None:
    payload, reason = HOSTILE[case]
    spec = SampleSpec(input_shape=(3,), target_shape=(1,), max_message_bytes=1 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warnings either
        with pytest.raises(Rejection) as caught:
            decode_message(payload, spec)
    assert caught.value.reason == reason, caught.value.detail
    assert 0 < len(caught.value.detail) <= 300


def test_numbers_a_float32_holds_are_accepted_whatever_their_spelling() -> None:
    decoded = decode_message(js({"x": [2**64, -(2**70), 0], "y": [1], "seq": 2**63 - 1}), SPEC)
    np.testing.assert_array_equal(decoded.chunk.x, np.float32([[2**64, -(2**70), 0]]))
    assert decoded.seq == 2**63 - 1
    assert decode_message(mp({"x": [1, 2, 3], "y": [1], "ts": 0}), SPEC).chunk.published_at == 0


def test_an_unforeseen_exception_becomes_an_internal_rejection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> None:
        raise ZeroDivisionError("division by zero " + "x" * 1000)

    monkeypatch.setattr(codec, "_shape_inputs", broken)
    with pytest.raises(Rejection) as caught:
        decode_message(js({"x": [1, 2, 3], "y": [1]}), SPEC)
    assert caught.value.reason == "internal"
    assert caught.value.detail.startswith("ZeroDivisionError: division by zero")
    assert len(caught.value.detail) < 300


@pytest.mark.parametrize("dtype", [*sorted(RAW_DTYPES), ">f8", ">i4", "<u4"])
def test_what_the_publisher_encodes_raw_the_server_decodes(dtype: str) -> None:
    """Both sides take their formats from ``livefit.server.wire.formats``: every dtype a
    publisher holds is sent as a buffer the server accepts (its own, made little-endian, or
    float32)."""
    values = np.arange(6).reshape(2, 3) % 3
    x = values.astype(np.dtype(dtype))
    payload = encode_samples(x, np.array([1.0, 2.0]), fmt="msgpack", batched=True, raw=True)
    sent = msgpack.unpackb(payload)["x"]["dtype"]
    assert sent in RAW_DTYPES
    decoded = decode_message(payload, SampleSpec((3,), (1,)), FORMATS["msgpack"].content_type)
    np.testing.assert_array_equal(decoded.chunk.x, values.astype(np.float32))
