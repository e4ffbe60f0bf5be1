"""The weight payload (``weights.format``): one snapshot always encodes to the same bytes."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from livefit.server.weights.format import (
    EnvelopeHeader,
    WeightsMeta,
    WeightsRejected,
    decode_weights,
    encode_header,
    encode_weights,
    open_envelope,
    seal,
)
from tests.weight_envelopes import Weights

L1 = "1" * 32


@pytest.fixture(scope="module")
def weights() -> Weights:
    return Weights.of("linear")


def test_one_snapshot_always_encodes_to_the_same_bytes(weights: Weights) -> None:
    """A split learner encodes each snapshot twice (the weight topic, its serving processes):
    the payload a manifest signs must be the one its serving processes answer a pull with.
    safetensors writes its metadata in hash-map order, so the header is made canonical."""
    meta = WeightsMeta(model="demo", version=7, samples_seen=70, created_at=time.time(),
                       newest_published_at=time.time(), fingerprint=weights.fingerprint,
                       lineage=L1)  # fmt: skip
    payloads = {encode_weights(weights.names, weights.arrays, meta) for _ in range(20)}
    assert len(payloads) == 1
    (data,) = payloads
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size]
    canonical = json.dumps(json.loads(header), sort_keys=True, separators=(",", ":"))
    assert size % 8 == 0 and header.decode().rstrip(" ") == canonical
    names, arrays, decoded = decode_weights(data)
    assert names == list(weights.names) and decoded == meta
    for got, want in zip(arrays, weights.arrays, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_serving_record_rides_in_the_header_and_is_absent_when_empty() -> None:
    """``serving`` round-trips; an envelope without a record signs the header older learners
    signed, byte for byte, so their receivers and verifiers see nothing new."""
    fields = {
        "kind": "weights", "topic": "livefit/demo/weights", "model": "demo", "lineage": L1,
        "version": 3, "created_at": 1.5, "signed_at": 2.5, "size": 8, "sha256": "0" * 64,
        "fingerprint": "f", "key_id": "k", "description_sha256": "",
    }  # fmt: skip
    older = json.dumps({"format": 1, **fields}, sort_keys=True, separators=(",", ":")).encode()
    assert encode_header(EnvelopeHeader(**fields)) == older
    assert b"serving" not in older
    text = '{"labels":{"stable":2}}'
    with_record = encode_header(EnvelopeHeader(**fields, serving=text))
    assert json.loads(with_record)["serving"] == text
    assert opened(with_record) == EnvelopeHeader(**fields, serving=text)
    assert opened(older).serving == ""
    with pytest.raises(WeightsRejected, match="serving must be a string"):
        opened(with_record.replace(b'"serving":"', b'"serving":["').replace(b'}"', b'}"]'))


def opened(header: bytes) -> EnvelopeHeader:
    """The header an unsigned envelope of ``header`` (and an 8-byte body) opens to."""
    return open_envelope(seal(header, b"", b"", bytes(8))).header
