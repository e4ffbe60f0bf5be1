"""The weight payload (``weights.format``): one snapshot always encodes to the same bytes."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from livefit.server.weights.format import (
    WeightsMeta,
    decode_weights,
    encode_weights,
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
