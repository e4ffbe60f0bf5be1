"""Who may publish weights: the Ed25519 keys, their files, and the learner's signing key.

The learner holds an Ed25519 private key and signs every weights envelope; replicas and
``WeightSubscriber`` hold only the public key, so a compromised replica cannot sign. Without
a configured ``weights.signing_key_file`` the learner creates one in its storage dir on first
start (``<storage.dir>/keys/weights-signing.key``, mode 0600, PEM PKCS#8) and writes the public
key next to it (``weights-signing.pub``, PEM), which a replica sharing that storage dir finds
on its own. Anywhere else, a replica is given the public key: ``weights.verify_key`` (base64
of the raw 32 bytes, as the learner logs it, or PEM text) or ``weights.verify_key_file``.

A shared ``weights.hmac_key`` still works, beside the signature: it is weaker (anyone holding
it can forge). A receiver with neither refuses to start unless ``weights.allow_unsigned``; the
receivers' verification policy is ``receiver_auth``'s.

``python -m livefit.server.weights.keys PRIVATE [PUBLIC]`` creates a key pair (or keeps an
existing private key) and writes its public key: compose's key init step.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..config.model_tables import WeightsSettings
from ..config.settings import ConfigError, Settings
from .format import EnvelopeHeader, encode_header, hmac_tag, seal, signed_message

log = logging.getLogger(__name__)
_loaded: dict[Path, SigningKey] = {}  # the learner's keys by path: loaded and logged once
_loaded_lock = threading.Lock()
KEYS_DIR = "keys"
DEFAULT_KEY_NAME = "weights-signing.key"
DEFAULT_PUBLIC_NAME = "weights-signing.pub"
# A PEM Ed25519 key is about 120 bytes; a key file beyond this is not one (``/dev/zero`` would
# otherwise be read until the memory is full).
MAX_KEY_FILE_BYTES = 64 * 1024


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
        loaded = _load_pem(serialization.load_pem_public_key, stripped, "public")
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("the PEM key is not an Ed25519 public key")
        return VerifyKey(loaded)
    raw = _raw_32(data, stripped)
    return VerifyKey(Ed25519PublicKey.from_public_bytes(raw))


def parse_signing_key(data: bytes, path: Path | None = None) -> SigningKey:
    """A private key from PEM (PKCS#8, unencrypted), base64 or hex of the raw 32-byte seed."""
    stripped = data.strip()
    if stripped.startswith(b"-----BEGIN"):
        loaded = _load_pem(serialization.load_pem_private_key, stripped, "private", password=None)
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ValueError("the PEM key is not an Ed25519 private key")
        return SigningKey(loaded, path)
    return SigningKey(Ed25519PrivateKey.from_private_bytes(_raw_32(data, stripped)), path)


def _load_pem(load: Any, pem: bytes, kind: str, **options: Any) -> Any:
    """``load(pem, **options)`` (cryptography's PEM loaders); whatever it refuses with (an
    encrypted key: TypeError; an unknown algorithm) as one ValueError line."""
    try:
        return load(pem, **options)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"not a usable unencrypted PEM {kind} key ({first})") from None


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


def read_key_file(path: Path) -> bytes:
    """The bytes of a key file that is a regular file of at most ``MAX_KEY_FILE_BYTES``.

    Checked on the open file before reading: a FIFO would block the read forever and a device
    such as ``/dev/zero`` never ends (opened non-blocking, so neither waits). ValueError says
    what the file is; OSError (FileNotFoundError when missing) when it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError(f"not a regular file ({_file_kind(status.st_mode)})")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)  # a regular file never returns short early
        if len(data) > MAX_KEY_FILE_BYTES or status.st_size > MAX_KEY_FILE_BYTES:
            raise ValueError(
                f"{max(status.st_size, len(data))} bytes: a key file is at most "
                f"{MAX_KEY_FILE_BYTES // 1024} KiB"
            )
        return data
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((kind for test, kind in kinds if test(mode)), "not a file")


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
        data = read_key_file(path)
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
            data = read_key_file(path)
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
        if read_key_file(path) == pem:
            return
    except (OSError, ValueError):  # missing, or not a key file: replaced below
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(pem)
    tmp.chmod(0o644)
    tmp.replace(path)


def check_signing_keys(settings: Settings) -> None:
    """Read and parse every model's signing key that exists, making none: its
    ``weights.signing_key_file``, else the key the learner made in its storage dir (none yet is
    fine: it is made on first start). ConfigError naming the file and what is wrong.
    ``livefit serve`` checks before it starts anything, so that a garbage key file is one
    line and exit 2, not a traceback from a started process."""
    for name, model in settings.models.items():
        configured = model.weights.signing_key_file
        path = Path(configured) if configured else default_key_path(settings.storage.dir)
        setting = f"models.{name}.weights.signing_key_file" if configured else (
            f"models.{name}.weights (the signing key the learner made)"
        )  # fmt: skip
        try:
            parse_signing_key(read_key_file(path), path)
        except FileNotFoundError:
            if not configured:
                continue
            raise ConfigError(f"{setting}: cannot read {path}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"{setting}: {path}: {exc}") from None


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
            key = parse_signing_key(read_key_file(path), path)
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
    try:
        key, created = ensure_signing_key(path, public_path)
    except OSError as exc:
        raise ConfigError(f"models.{model}.weights: cannot use {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"models.{model}.weights: {path}: {exc}") from None
    log.info(
        "weights of %s signed with Ed25519 key %s %s %s; public key %s (also in %s): give it to "
        "replicas and WeightSubscriber as weights.verify_key", model, key.key_id,
        "created in" if created else "from", path, key.public.base64(), public_path,
    )  # fmt: skip
    return key


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[0].startswith("-"):
        print("usage: python -m livefit.server.weights.keys PRIVATE_KEY_FILE "
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
