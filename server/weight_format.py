"""The weight-stream format: safetensors with metadata, sha256, optional HMAC, and manifests.

A snapshot travels as one safetensors file (never pickle). Tensor keys are
``"{index:04d}:{variable path}"`` so the order of ``model.weights`` survives; the safetensors
metadata (strings only) carries the model name, version, samples seen, creation time, the
newest sample time and the architecture fingerprint. Integrity travels beside the payload: its
sha256, and with a shared key an HMAC-SHA256 over ``topic + NUL + payload``.

A payload over the inline limit is replaced on MQTT by a small JSON manifest (version, size,
sha256, URL); receivers pull the payload over HTTP and check it against the manifest.

This module is pure (numpy, safetensors, hashlib): the learner, replicas and the client
library's ``WeightSubscriber`` all use it, so all of them verify the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

WEIGHTS_CONTENT_TYPE = "application/vnd.livefit.weights+safetensors"
MANIFEST_CONTENT_TYPE = "application/vnd.livefit.weights-manifest+json"
FORMAT_VERSION = "1"


class WeightsRejected(Exception):
    """A weights message that must not be applied; ``outcome`` is a bounded metric label."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(f"{outcome}: {detail}")
        self.outcome = outcome
        self.detail = detail


@dataclass(frozen=True, slots=True)
class WeightsMeta:
    """What a weights payload says about itself."""

    model: str
    version: int
    samples_seen: int
    created_at: float
    newest_published_at: float | None
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """Points to a payload too large to publish inline."""

    model: str
    version: int
    size: int
    sha256: str
    url: str
    created_at: float


def architecture_fingerprint(names: Sequence[str], arrays: Sequence[np.ndarray]) -> str:
    """sha256 of the (name, shape, dtype) list: equal iff two models can swap weights."""
    spec = [[n, list(a.shape), str(np.dtype(a.dtype))] for n, a in zip(names, arrays, strict=True)]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


def encode_weights(names: Sequence[str], arrays: Sequence[np.ndarray], meta: WeightsMeta) -> bytes:
    """One safetensors payload holding ``arrays`` in order, with ``meta`` in its header."""
    tensors = {
        f"{i:04d}:{n}": np.ascontiguousarray(a)
        for i, (n, a) in enumerate(zip(names, arrays, strict=True))
    }
    metadata = {
        "format": FORMAT_VERSION,
        "model": meta.model,
        "version": str(meta.version),
        "samples_seen": str(meta.samples_seen),
        "created_at": repr(meta.created_at),
        "newest_published_at": ""
        if meta.newest_published_at is None
        else repr(meta.newest_published_at),
        "fingerprint": meta.fingerprint,
    }
    return bytes(st_save(tensors, metadata=metadata))


def decode_weights(payload: bytes) -> tuple[list[str], list[np.ndarray], WeightsMeta]:
    """Names, arrays (in model order) and metadata of a payload; WeightsRejected if malformed."""
    try:
        tensors = st_load(payload)
        header_len = int.from_bytes(payload[:8], "little")
        header = json.loads(payload[8 : 8 + header_len])
        raw_meta = header.get("__metadata__", {})
        meta = WeightsMeta(
            model=raw_meta["model"],
            version=int(raw_meta["version"]),
            samples_seen=int(raw_meta["samples_seen"]),
            created_at=float(raw_meta["created_at"]),
            newest_published_at=float(raw_meta["newest_published_at"])
            if raw_meta.get("newest_published_at")
            else None,
            fingerprint=raw_meta["fingerprint"],
        )
    except (SafetensorError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise WeightsRejected("bad_payload", f"not a livefit safetensors payload: {exc}") from None
    keys = sorted(tensors)
    names = [k.split(":", 1)[1] if ":" in k else k for k in keys]
    return names, [tensors[k] for k in keys], meta


def sha256_hex(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def sign(key: bytes, topic: str, payload: bytes) -> str:
    """HMAC-SHA256 over topic, a NUL byte and the payload, as hex."""
    return hmac.new(key, topic.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def verify(
    topic: str,
    payload: bytes,
    sha256: str | None,
    signature: str | None,
    key: bytes | None,
) -> None:
    """Raise WeightsRejected unless the payload matches its sha256 and (with a key) its HMAC."""
    if sha256 is not None and not hmac.compare_digest(sha256, sha256_hex(payload)):
        raise WeightsRejected("bad_sha256", "payload does not match its sha256")
    if key is None:
        return
    if not signature:
        raise WeightsRejected("unsigned", "an HMAC key is configured but the message is unsigned")
    if not hmac.compare_digest(signature, sign(key, topic, payload)):
        raise WeightsRejected("bad_hmac", "HMAC does not match: forged or signed with another key")


def check_arrays(arrays: Sequence[np.ndarray], expected_fingerprint: str, names: Sequence[str],
                 meta: WeightsMeta) -> None:  # fmt: skip
    """Raise WeightsRejected unless the arrays fit the local model and are all finite."""
    if (
        meta.fingerprint != expected_fingerprint
        or architecture_fingerprint(names, arrays) != expected_fingerprint
    ):
        raise WeightsRejected(
            "wrong_architecture",
            f"weights for a different architecture (fingerprint {meta.fingerprint[:12]}, "
            f"this model {expected_fingerprint[:12]}); check that both sides use the same config",
        )
    for name, array in zip(names, arrays, strict=True):
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise WeightsRejected("non_finite", f"weight {name} holds NaN or infinity")


def encode_manifest(manifest: Manifest) -> bytes:
    return json.dumps(
        {
            "kind": "livefit-weights-manifest",
            "model": manifest.model,
            "version": manifest.version,
            "size": manifest.size,
            "sha256": manifest.sha256,
            "url": manifest.url,
            "created_at": manifest.created_at,
        }
    ).encode()


def decode_manifest(payload: bytes) -> Manifest:
    try:
        doc = json.loads(payload)
        if doc.get("kind") != "livefit-weights-manifest":
            raise ValueError("not a manifest")
        return Manifest(
            model=str(doc["model"]),
            version=int(doc["version"]),
            size=int(doc["size"]),
            sha256=str(doc["sha256"]),
            url=str(doc["url"]),
            created_at=float(doc["created_at"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WeightsRejected("bad_payload", f"invalid weights manifest: {exc}") from None
