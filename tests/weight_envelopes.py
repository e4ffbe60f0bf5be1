"""Build weight-stream messages the way a learner (or an attacker) would, for tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from livefit.models.builders import build_model, weight_names
from livefit.models.description import describe, description_json
from livefit.server.weights.format import (
    MAGIC,
    EnvelopeHeader,
    WeightsMeta,
    architecture_fingerprint,
    description_sha256,
    encode_header,
    encode_weights,
    seal,
    sha256_hex,
)
from livefit.server.weights.keys import SigningKey


@dataclass
class Weights:
    """A model's weight names and arrays, its architecture fingerprint and (as a learner
    publishes it) its description."""

    names: list[str]
    arrays: list[np.ndarray]
    description: str = ""
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = architecture_fingerprint(self.names, self.arrays)

    @classmethod
    def of(cls, builder: str, options: dict | None = None, seed: int = 1, dim: int = 8,
           **build: Any) -> Weights:  # fmt: skip
        """``build_model``'s network (``build``: its ``loss``, ``scaling``, ``experts``, ...;
        input scaling unless told), with its description."""
        build = {"scaling": "standardize", **build}
        model = build_model(builder, [dim], [1], options or {}, seed=seed, **build)
        text = description_json(describe(model, loss=build.get("loss", "mse")))
        return cls(weight_names(model), model.get_weights(), text)


def payload(
    weights: Weights,
    model: str = "demo",
    version: int = 1,
    lineage: str = "a" * 32,
    created_at: float | None = None,
    arrays: list[np.ndarray] | None = None,
) -> bytes:
    meta = WeightsMeta(model, version, 0, time.time() if created_at is None else created_at,
                       None, weights.fingerprint, lineage, weights.description)  # fmt: skip
    return encode_weights(weights.names, arrays or weights.arrays, meta)


def envelope(
    signer: SigningKey | None,
    weights: Weights,
    topic: str = "livefit/demo/weights",
    model: str = "demo",
    version: int = 1,
    lineage: str = "a" * 32,
    created_at: float | None = None,
    signed_at: float | None = None,
    body: bytes | None = None,
    kind: str = "weights",
    hmac_key: bytes | None = None,
    header_changes: dict | None = None,
) -> bytes:
    """A weights message; ``body`` replaces the real payload (the header still names it)."""
    now = time.time()
    created = now if created_at is None else created_at
    data = payload(weights, model, version, lineage, created)
    header = EnvelopeHeader(
        kind=kind, topic=topic, model=model, lineage=lineage, version=version,
        created_at=created, signed_at=now if signed_at is None else signed_at,
        size=len(data), sha256=sha256_hex(data), fingerprint=weights.fingerprint,
        key_id=signer.key_id if signer else "",
        description_sha256=description_sha256(weights.description),
    )  # fmt: skip
    for key, value in (header_changes or {}).items():
        header = EnvelopeHeader(**{**_fields(header), key: value})
    sent = (data if body is None else body) if kind == "weights" else b""
    if signer is None:
        return seal(encode_header(header), b"", b"", sent)
    return signer.seal(header, sent, hmac_key)


def _fields(header: EnvelopeHeader) -> dict:
    return {name: getattr(header, name) for name in EnvelopeHeader.__dataclass_fields__}


def forged(
    weights: Weights, signer: SigningKey, topic: str = "livefit/demo/weights"
) -> list[tuple[str, bytes]]:
    """(expected outcome, message) for every way a message can fail authentication."""
    attacker = SigningKey.generate()
    good = envelope(signer, weights, topic=topic, version=10**9)
    tampered = good.replace(b'"version":1000000000', b'"version":2000000000')
    assert tampered != good
    nan = [np.full_like(a, np.nan) for a in weights.arrays]
    other = Weights.of("mlp", {"hidden_units": [3]})
    return [
        ("unsigned", payload(weights, version=10**9)),  # a bare safetensors snapshot
        ("unsigned", b'{"kind": "livefit-weights-manifest", "url": "http://evil/"}'),
        ("unsigned", envelope(None, weights, topic=topic, version=10**9)),
        ("bad_signature", envelope(attacker, weights, topic=topic, version=10**9)),
        ("bad_signature", tampered),
        (
            "bad_sha256",
            envelope(
                signer, weights, topic=topic, body=payload(weights, version=10**9)[:-4] + b"\0" * 4
            ),
        ),
        ("bad_payload", good[:20]),
        ("bad_payload", MAGIC + b"\xff\xff\xff\xff"),
        ("wrong_topic", envelope(signer, weights, topic=topic + "/other")),
        ("wrong_model", envelope(signer, weights, topic=topic, model="other")),
        ("wrong_architecture", envelope(signer, other, topic=topic, version=10**9)),
        (
            "non_finite",
            signed_for(signer, weights, payload(weights, version=1, arrays=nan), 1, topic),
        ),
    ]


def signed_for(
    signer: SigningKey,
    weights: Weights,
    data: bytes,
    version: int,
    topic: str = "livefit/demo/weights",
) -> bytes:
    """An envelope whose header names ``data`` exactly, whatever ``data`` holds."""
    header = EnvelopeHeader("weights", topic, "demo", "a" * 32, version, time.time(),
                            time.time(), len(data), sha256_hex(data), weights.fingerprint,
                            description_sha256=description_sha256(weights.description))  # fmt: skip
    return signer.seal(header, data)
