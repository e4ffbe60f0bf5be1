"""The weight-stream format: a signed envelope around a safetensors snapshot (or a manifest).

A snapshot is one safetensors file (never pickle). Tensor keys are
``"{index:04d}:{variable path}"`` so the order of ``model.weights`` survives; the safetensors
metadata (strings only) carries the model name, lineage, version, samples seen, creation
time, the newest sample time, the architecture fingerprint and the network's *description*
(``description``: canonical JSON, ``livefit.models.description``: what a process needs to run
the network without the learner's config; absent from older learners). This is also what
``GET /v1/models/{name}/weights`` serves. Its JSON header is canonical (keys sorted, no
spaces, padded with spaces to 8 bytes), so one snapshot always encodes to the same bytes and
sha256: a split learner encodes each snapshot twice, once for the weight topic and once for its
serving processes, and the two must match (safetensors itself writes the metadata in hash-map
order, different from one call to the next).

On MQTT every message is an *envelope*, so that verification needs nothing from the
transport (it works over MQTT 3.1.1 and brokers without MQTT 5 properties)::

    offset  size  field
    0       4     magic b"LFW1"
    4       4     H: header length, unsigned big-endian (at most 65536)
    8       H     header: a UTF-8 JSON object (below)
    8+H     2     S: signature length, unsigned big-endian (0, or 64 for Ed25519)
    10+H    S     Ed25519 signature of  b"livefit-weights-v1\\x00" + header bytes
    10+H+S  2     M: MAC length, unsigned big-endian (0, or 32)
    12+H+S  M     HMAC-SHA256(hmac_key, b"livefit-weights-v1\\x00" + header bytes)
    12+H+S+M      body: the safetensors payload ("weights"), or nothing ("manifest")

Header keys: ``format`` (1), ``kind`` ("weights" or "manifest"), ``topic`` (the MQTT topic it
was published on), ``model``, ``lineage``, ``version``, ``created_at`` (epoch seconds, the
learner's clock, when the snapshot was taken), ``signed_at`` (when this envelope was signed;
re-signed snapshots keep ``created_at``), ``size`` and ``sha256`` (length and hex sha256 of
the safetensors payload), ``fingerprint`` (architecture), ``description_sha256`` (hex sha256
of the payload's ``description`` metadata; "" when it has none), ``key_id`` (hex sha256 of
the raw 32-byte Ed25519 public key, first 16 characters; "" when unsigned) and ``serving``
(the model's serving record, ``wire.serving_record``: labels, pin, rollbacks, and the sha256
of each named version's payload, which travel apart; "" or absent from older learners).
Receivers ignore header keys they do not know, so older replicas take envelopes with
``description_sha256`` and ``serving``.
The signature covers the header bytes exactly as sent, and the header binds the body by its
sha256 (and so the description inside it), so a verifier
in any language needs: split, verify Ed25519 over context + header, parse the JSON, compare
``topic`` and ``model`` with what it subscribed to, hash the body (or the pulled payload).

This module is pure (numpy, safetensors, hashlib, json): the learner, replicas and the client
library's ``WeightSubscriber`` all use it, so all of them verify the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

WEIGHTS_CONTENT_TYPE = "application/vnd.livefit.weights+safetensors"
ENVELOPE_CONTENT_TYPE = "application/vnd.livefit.weights-envelope"
FORMAT_VERSION = "1"
MAGIC = b"LFW1"
SIGNING_CONTEXT = b"livefit-weights-v1\x00"
MAX_HEADER_BYTES = 65536
ED25519_SIGNATURE_BYTES = 64
HMAC_BYTES = 32
KINDS = ("weights", "manifest")


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
    lineage: str = ""
    description: str = ""  # the network's description, canonical JSON ("" from older learners)


@dataclass(frozen=True, slots=True)
class EnvelopeHeader:
    """The signed part of a weights message (see the module docstring for the layout)."""

    kind: str
    topic: str
    model: str
    lineage: str
    version: int
    created_at: float
    signed_at: float
    size: int
    sha256: str
    fingerprint: str
    key_id: str = ""
    description_sha256: str = ""
    serving: str = ""  # the model's serving record, canonical JSON ("" from older learners)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A parsed (not yet verified) weights message."""

    header: EnvelopeHeader
    header_bytes: bytes
    signature: bytes
    mac: bytes
    body: bytes

    def signed_bytes(self) -> bytes:
        return signed_message(self.header_bytes)


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
        "lineage": meta.lineage,
        "version": str(meta.version),
        "samples_seen": str(meta.samples_seen),
        "created_at": repr(meta.created_at),
        "newest_published_at": ""
        if meta.newest_published_at is None
        else repr(meta.newest_published_at),
        "fingerprint": meta.fingerprint,
    }
    if meta.description:
        metadata["description"] = meta.description
    return _canonical_header(bytes(st_save(tensors, metadata=metadata)))


def _canonical_header(payload: bytes) -> bytes:
    """``payload`` with its safetensors header rewritten canonically (sorted keys, compact,
    space-padded to a multiple of 8 bytes); the tensor data and its offsets are unchanged."""
    size = int.from_bytes(payload[:8], "little")
    header = json.dumps(
        json.loads(payload[8 : 8 + size]), sort_keys=True, separators=(",", ":")
    ).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + payload[8 + size :]


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
            lineage=str(raw_meta.get("lineage", "")),
            description=str(raw_meta.get("description", "")),
        )
    except (SafetensorError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise WeightsRejected("bad_payload", f"not a livefit safetensors payload: {exc}") from None
    keys = sorted(tensors)
    names = [k.split(":", 1)[1] if ":" in k else k for k in keys]
    return names, [tensors[k] for k in keys], meta


def payload_description(payload: bytes) -> str:
    """The ``description`` metadata of a safetensors payload ("" when it has none or is not
    one), read from its header alone."""
    try:
        size = int.from_bytes(payload[:8], "little")
        meta = json.loads(payload[8 : 8 + size]).get("__metadata__") or {}
    except (ValueError, AttributeError):
        return ""
    description = meta.get("description", "") if isinstance(meta, dict) else ""
    return description if isinstance(description, str) else ""


def sha256_hex(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def description_sha256(description: str) -> str:
    """What the envelope header's ``description_sha256`` says of a description ("" for none)."""
    return sha256_hex(description.encode()) if description else ""


def signed_message(header_bytes: bytes) -> bytes:
    """What the Ed25519 signature and the HMAC are computed over."""
    return SIGNING_CONTEXT + header_bytes


def hmac_tag(key: bytes, header_bytes: bytes) -> bytes:
    return hmac.new(key, signed_message(header_bytes), hashlib.sha256).digest()


def encode_header(header: EnvelopeHeader) -> bytes:
    doc = {"format": int(FORMAT_VERSION), **asdict(header)}
    if not header.serving:  # no record: the header older learners signed, byte for byte
        del doc["serving"]
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def seal(header_bytes: bytes, signature: bytes, mac: bytes, body: bytes) -> bytes:
    """Assemble an envelope from its parts (signatures computed by the caller)."""
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise ValueError(f"envelope header of {len(header_bytes)} bytes is too long")
    return b"".join(
        (
            MAGIC,
            struct.pack(">I", len(header_bytes)),
            header_bytes,
            struct.pack(">H", len(signature)),
            signature,
            struct.pack(">H", len(mac)),
            mac,
            body,
        )
    )


def detached(envelope: Envelope) -> bytes:
    """``envelope`` without its body: the signed header alone, which still binds the payload
    by size and sha256 (``envelope_bytes + payload`` is the inline envelope again)."""
    return seal(envelope.header_bytes, envelope.signature, envelope.mac, b"")


def open_envelope(data: bytes) -> Envelope:
    """Split and parse an envelope (no verification); WeightsRejected when malformed.

    A message that is not an envelope at all (no magic: e.g. a bare safetensors payload, or an
    old-style JSON manifest) carries no signature: outcome ``unsigned``.
    """
    if not data.startswith(MAGIC):
        raise WeightsRejected("unsigned", "not a livefit weights envelope (no signature)")
    view = memoryview(data)
    try:
        (header_len,) = struct.unpack_from(">I", view, 4)
        if header_len > MAX_HEADER_BYTES:
            raise ValueError(f"header length {header_len} over {MAX_HEADER_BYTES}")
        offset = 8 + header_len
        header_bytes = bytes(view[8:offset])
        if len(header_bytes) != header_len:
            raise ValueError("truncated header")
        (sig_len,) = struct.unpack_from(">H", view, offset)
        signature = bytes(view[offset + 2 : offset + 2 + sig_len])
        offset += 2 + sig_len
        (mac_len,) = struct.unpack_from(">H", view, offset)
        mac = bytes(view[offset + 2 : offset + 2 + mac_len])
        offset += 2 + mac_len
        if len(signature) != sig_len or len(mac) != mac_len or offset > len(data):
            raise ValueError("truncated signature or MAC")
        header = _parse_header(header_bytes)
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise WeightsRejected("bad_payload", f"malformed weights envelope: {exc}") from None
    return Envelope(header, header_bytes, signature, mac, bytes(view[offset:]))


def _parse_header(header_bytes: bytes) -> EnvelopeHeader:
    doc = json.loads(header_bytes)
    if not isinstance(doc, dict):
        raise ValueError("header is not a JSON object")
    if doc.get("format") != int(FORMAT_VERSION):
        raise ValueError(f"unsupported envelope format {doc.get('format')!r}")
    kind = doc["kind"]
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    strings = (
        "topic", "model", "lineage", "sha256", "fingerprint", "key_id", "description_sha256",
        "serving",
    )  # fmt: skip
    for key in strings:
        if not isinstance(doc.get(key, ""), str):
            raise ValueError(f"{key} must be a string")
    for key in ("version", "size"):
        if not isinstance(doc[key], int) or isinstance(doc[key], bool) or doc[key] < 0:
            raise ValueError(f"{key} must be a non-negative integer")
    for key in ("created_at", "signed_at"):
        if not isinstance(doc[key], int | float) or isinstance(doc[key], bool):
            raise ValueError(f"{key} must be a number")
    return EnvelopeHeader(
        kind=kind,
        topic=doc["topic"],
        model=doc["model"],
        lineage=doc["lineage"],
        version=doc["version"],
        created_at=float(doc["created_at"]),
        signed_at=float(doc["signed_at"]),
        size=doc["size"],
        sha256=doc["sha256"],
        fingerprint=doc["fingerprint"],
        key_id=doc.get("key_id", ""),
        description_sha256=doc.get("description_sha256", ""),
        serving=doc.get("serving", ""),
    )


def check_body(body: bytes, header: EnvelopeHeader) -> None:
    """Raise WeightsRejected unless ``body`` is exactly the payload the header names."""
    if len(body) != header.size or not hmac.compare_digest(sha256_hex(body), header.sha256):
        raise WeightsRejected(
            "bad_sha256", f"payload ({len(body)} bytes) does not match its signed sha256 and size"
        )


def check_matches(meta: WeightsMeta, header: EnvelopeHeader) -> None:
    """The payload's own metadata must say what its signed envelope says."""
    if (meta.model, meta.lineage, meta.version) != (header.model, header.lineage, header.version):
        raise WeightsRejected(
            "bad_payload",
            f"payload says {meta.model} {meta.lineage[:8]} v{meta.version}, its envelope "
            f"{header.model} {header.lineage[:8]} v{header.version}",
        )
    # The payload's sha256 binds its description already; a header naming one must agree.
    if header.description_sha256 and description_sha256(meta.description) != (
        header.description_sha256
    ):
        raise WeightsRejected(
            "bad_payload", "the payload's description is not the one its envelope signed"
        )


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
