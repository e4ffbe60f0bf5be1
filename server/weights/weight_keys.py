"""Who may publish weights: Ed25519 keys, and the verification policy of a receiver.

The learner holds an Ed25519 private key and signs every weights envelope; replicas and
``WeightSubscriber`` hold only the public key, so a compromised replica cannot sign. Without
a configured ``weights.signing_key_file`` the learner creates one in its storage dir on first
start (``<storage.dir>/keys/weights-signing.key``, mode 0600, PEM PKCS#8) and writes the public
key next to it (``weights-signing.pub``, PEM), which a replica sharing that storage dir finds
on its own. Anywhere else, a replica is given the public key: ``weights.verify_key`` (base64
of the raw 32 bytes, as the learner logs it, or PEM text) or ``weights.verify_key_file``.

A shared ``weights.hmac_key`` still works, beside the signature: it is weaker (anyone holding
it can forge). A receiver with neither refuses to start unless ``weights.allow_unsigned``.

``python -m livefit.server.weights.weight_keys PRIVATE [PUBLIC]`` creates a key pair (or keeps an
existing private key) and writes its public key: compose's key init step.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from livefit.server.config import ConfigError, Settings, WeightsSettings
from livefit.server.weights.weight_format import (
    ED25519_SIGNATURE_BYTES,
    Envelope,
    EnvelopeHeader,
    WeightsRejected,
    encode_header,
    hmac_tag,
    seal,
    signed_message,
)

log = logging.getLogger(__name__)
_loaded: dict[Path, SigningKey] = {}  # the learner's keys by path: loaded and logged once
_loaded_lock = threading.Lock()
KEYS_DIR = "keys"
DEFAULT_KEY_NAME = "weights-signing.key"
DEFAULT_PUBLIC_NAME = "weights-signing.pub"


def key_id(public_raw: bytes) -> str:
    """A short name for a public key: the first 16 hex characters of its sha256."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


class SigningKey:
    """The learner's Ed25519 private key."""

    def __init__(self, private: Ed25519PrivateKey, path: Path | None = None) -> None:
        self._private = private
        self.path = path
        self.public = VerifyKey(private.public_key())

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def private_pem(self) -> bytes:
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def seal(self, header: EnvelopeHeader, body: bytes, hmac_key: bytes | None = None) -> bytes:
        """An envelope for ``header`` and ``body``, signed (and MACed with ``hmac_key``)."""
        header_bytes = encode_header(header)
        signature = self.sign(signed_message(header_bytes))
        mac = hmac_tag(hmac_key, header_bytes) if hmac_key is not None else b""
        return seal(header_bytes, signature, mac, body)


class VerifyKey:
    """An Ed25519 public key."""

    def __init__(self, public: Ed25519PublicKey) -> None:
        self._public = public
        self.raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = key_id(self.raw)

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            self._public.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def base64(self) -> str:
        return base64.b64encode(self.raw).decode()

    def pem(self) -> bytes:
        return self._public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def parse_verify_key(text: str | bytes) -> VerifyKey:
    """A public key from PEM, base64 or hex of the raw 32 bytes, or the raw bytes; ValueError."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    stripped = data.strip()
    if stripped.startswith(b"-----BEGIN"):
        loaded = serialization.load_pem_public_key(stripped)
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("the PEM key is not an Ed25519 public key")
        return VerifyKey(loaded)
    raw = _raw_32(data, stripped)
    return VerifyKey(Ed25519PublicKey.from_public_bytes(raw))


def parse_signing_key(data: bytes, path: Path | None = None) -> SigningKey:
    """A private key from PEM (PKCS#8, unencrypted), base64 or hex of the raw 32-byte seed."""
    stripped = data.strip()
    if stripped.startswith(b"-----BEGIN"):
        loaded = serialization.load_pem_private_key(stripped, password=None)
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ValueError("the PEM key is not an Ed25519 private key")
        return SigningKey(loaded, path)
    return SigningKey(Ed25519PrivateKey.from_private_bytes(_raw_32(data, stripped)), path)


def _raw_32(data: bytes, stripped: bytes) -> bytes:
    if len(data) == 32:
        return data
    decoders = (
        binascii.unhexlify,
        lambda text: base64.b64decode(text, validate=True),
        lambda text: base64.b64decode(text, altchars=b"-_", validate=True),
    )
    for decode in decoders:
        try:
            raw = decode(stripped)
        except (binascii.Error, ValueError):
            continue
        if len(raw) == 32:
            return raw
    raise ValueError("expected PEM, or 32 bytes raw, base64 or hex")


def default_key_path(storage_dir: str | Path) -> Path:
    return Path(storage_dir) / KEYS_DIR / DEFAULT_KEY_NAME


def default_public_path(storage_dir: str | Path) -> Path:
    return Path(storage_dir) / KEYS_DIR / DEFAULT_PUBLIC_NAME


def ensure_signing_key(path: Path, public_path: Path | None = None) -> tuple[SigningKey, bool]:
    """Load the private key at ``path``, or create it (mode 0600) when there is none; write
    the public key to ``public_path`` (PEM) if given. Returns the key and whether it is new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = False
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = SigningKey.generate().private_pem()
        # Written whole under a private name, then linked in: a second process starting on the
        # same storage sees either no key or the complete one, never a half-written file.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process created it meanwhile: use theirs
            data = path.read_bytes()
        else:
            created = True
        finally:
            tmp.unlink(missing_ok=True)
    key = parse_signing_key(data, path)
    if public_path is not None:
        _write_public(public_path, key.public)
    return key, created


def _write_public(path: Path, public: VerifyKey) -> None:
    pem = public.pem()
    try:
        if path.read_bytes() == pem:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(pem)
    tmp.chmod(0o644)
    tmp.replace(path)


def learner_signing_key(
    weights: WeightsSettings, storage_dir: str | Path, model: str
) -> SigningKey:
    """The key the learner signs ``model``'s weights with: configured, or made on first start.
    Loaded (and logged) once per process and path."""
    path = Path(weights.signing_key_file or default_key_path(storage_dir)).resolve()
    with _loaded_lock:
        key = _loaded.get(path)
        if key is None:
            key = _loaded[path] = _load_learner_key(weights, storage_dir, model)
    return key


def _load_learner_key(weights: WeightsSettings, storage_dir: str | Path, model: str) -> SigningKey:
    if weights.signing_key_file:
        path = Path(weights.signing_key_file)
        try:
            key = parse_signing_key(path.read_bytes(), path)
        except OSError as exc:
            raise ConfigError(
                f"models.{model}.weights.signing_key_file: cannot read {path}: {exc.strerror}"
            ) from None
        except ValueError as exc:
            raise ConfigError(f"models.{model}.weights.signing_key_file: {path}: {exc}") from None
        log.info("weights of %s signed with Ed25519 key %s from %s (public key %s)",
                 model, key.key_id, path, key.public.base64())  # fmt: skip
        return key
    path, public_path = default_key_path(storage_dir), default_public_path(storage_dir)
    key, created = ensure_signing_key(path, public_path)
    log.info(
        "weights of %s signed with Ed25519 key %s %s %s; public key %s (also in %s): give it to "
        "replicas and WeightSubscriber as weights.verify_key", model, key.key_id,
        "created in" if created else "from", path, key.public.base64(), public_path,
    )  # fmt: skip
    return key


@dataclass(frozen=True)
class Authenticator:
    """How a receiver checks who published a message: Ed25519 and/or HMAC, or nothing."""

    verify_key: VerifyKey | None = None
    hmac_key: bytes | None = None
    allow_unsigned: bool = False

    def __post_init__(self) -> None:
        if self.verify_key is None and self.hmac_key is None and not self.allow_unsigned:
            raise ValueError("no verify key, no HMAC key and unsigned weights not allowed")

    @property
    def describe(self) -> str:
        parts = []
        if self.verify_key is not None:
            parts.append(f"Ed25519 key {self.verify_key.key_id}")
        if self.hmac_key is not None:
            parts.append("HMAC")
        return " and ".join(parts) or "nothing (unsigned weights allowed)"

    def authenticate(self, envelope: Envelope) -> None:
        """Raise WeightsRejected unless ``envelope`` is signed as this receiver requires."""
        if self.verify_key is not None:
            if not envelope.signature:
                raise WeightsRejected("unsigned", "the message carries no signature")
            if len(envelope.signature) != ED25519_SIGNATURE_BYTES or not self.verify_key.verify(
                envelope.signature, envelope.signed_bytes()
            ):
                raise WeightsRejected(
                    "bad_signature",
                    f"Ed25519 signature does not verify with key {self.verify_key.key_id} "
                    f"(message names key {envelope.header.key_id or 'none'}): forged, tampered "
                    "or signed by another learner",
                )
        if self.hmac_key is not None:
            if not envelope.mac:
                raise WeightsRejected("unsigned", "an HMAC key is configured; the message has none")
            if not hmac.compare_digest(
                envelope.mac, hmac_tag(self.hmac_key, envelope.header_bytes)
            ):
                raise WeightsRejected("bad_hmac", "HMAC does not match: forged or another key")


def receiver_authenticator(settings: Settings, model: str, wait_s: float = 0.0) -> Authenticator:
    """The verification policy of a replica for ``model``; ConfigError when it has none.

    The public key comes from ``weights.verify_key``, else ``weights.verify_key_file``, else
    ``<storage.dir>/keys/weights-signing.pub`` when that file exists (a learner sharing the
    storage dir wrote it; with nothing else configured this waits up to ``wait_s`` for it, for
    a learner started at the same time). ``weights.allow_unsigned`` applies only when there is
    no key at all.
    """
    weights = settings.models[model].weights
    prefix = f"models.{model}.weights"
    verify_key: VerifyKey | None = None
    if not (weights.verify_key or weights.verify_key_file or weights.hmac_key):
        _wait_for_shared_key(default_public_path(settings.storage.dir), wait_s)
    if weights.verify_key:
        try:
            verify_key = parse_verify_key(weights.verify_key)
        except ValueError as exc:
            raise ConfigError(f"{prefix}.verify_key: {exc}") from None
    else:
        path = Path(weights.verify_key_file) if weights.verify_key_file else None
        if path is None and default_public_path(settings.storage.dir).is_file():
            path = default_public_path(settings.storage.dir)
        if path is not None:
            try:
                verify_key = parse_verify_key(path.read_bytes())
            except OSError as exc:
                raise ConfigError(
                    f"{prefix}.verify_key_file: cannot read {path}: {exc.strerror}"
                ) from None
            except ValueError as exc:
                raise ConfigError(f"{prefix}.verify_key_file: {path}: {exc}") from None
    hmac_key = weights.key_bytes()
    if verify_key is None and hmac_key is None:
        if not weights.allow_unsigned:
            raise ConfigError(
                f"{prefix}: no key to verify weights with. Set {prefix}.verify_key to the "
                "learner's public key (the learner logs it at start; also in its "
                f"<storage.dir>/{KEYS_DIR}/{DEFAULT_PUBLIC_NAME}) or {prefix}.verify_key_file "
                f"to that file; or, on a trusted network only, {prefix}.allow_unsigned = true"
            )
        log.warning(
            "WEIGHTS OF %s ARE NOT AUTHENTICATED (%s.allow_unsigned = true): anyone who can "
            "publish on %s controls what this process serves", model, prefix,
            settings.weights_topic(model),
        )  # fmt: skip
    return Authenticator(verify_key, hmac_key, allow_unsigned=weights.allow_unsigned)


def _wait_for_shared_key(path: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    if path.is_file() or wait_s <= 0:
        return
    log.info("no weights.verify_key set: waiting up to %.0f s for the learner's public key in %s",
             wait_s, path)  # fmt: skip
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[0].startswith("-"):
        print("usage: python -m livefit.server.weights.weight_keys PRIVATE_KEY_FILE "
              "[PUBLIC_KEY_FILE]", file=sys.stderr)  # fmt: skip
        return 2
    public = Path(args[1]) if len(args) == 2 else None
    key, created = ensure_signing_key(Path(args[0]), public)
    print(
        f"{'created' if created else 'kept'} {args[0]} (Ed25519 key {key.key_id}); "
        f"public key {key.public.base64()}" + (f", written to {public}" if public else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
