"""Whether a receiver believes who published weights: its verification policy (``Authenticator``:
Ed25519 and/or HMAC, or nothing when explicitly allowed) and where a replica's policy comes
from (``receiver_authenticator``: its configured key, key file, or the public key a learner
sharing its storage dir wrote). A receiver with no key refuses to start unless
``weights.allow_unsigned``. The keys themselves are ``weights.keys``'.
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..config.model_tables import WeightsSettings
from ..config.settings import ConfigError, Settings
from .format import ED25519_SIGNATURE_BYTES, Envelope, WeightsRejected, hmac_tag
from .keys import (
    DEFAULT_PUBLIC_NAME,
    KEYS_DIR,
    VerifyKey,
    default_public_path,
    parse_verify_key,
    read_key_file,
)

log = logging.getLogger(__name__)


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
    if not (weights.verify_key or weights.verify_key_file or weights.hmac_key):
        _wait_for_shared_key(default_public_path(settings.storage.dir), wait_s)
    verify_key = _configured_verify_key(weights, settings.storage.dir, prefix)
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


def check_verify_keys(settings: Settings, missing_ok: bool = False) -> None:
    """Parse every model's configured public key (``weights.verify_key``, its
    ``weights.verify_key_file``, or the one a learner sharing the storage dir wrote, when that
    file exists), waiting for none: ConfigError naming the setting or file and what is wrong.
    ``livefit replica`` checks before it starts anything; so does a split ``livefit serve``,
    with ``missing_ok`` (its training process may write that file on first start)."""
    for name, model in settings.models.items():
        weights = model.weights
        if missing_ok and weights.verify_key_file and not Path(weights.verify_key_file).exists():
            continue
        _configured_verify_key(weights, settings.storage.dir, f"models.{name}.weights")


def _configured_verify_key(
    weights: WeightsSettings, storage_dir: str | Path, prefix: str
) -> VerifyKey | None:
    """``weights.verify_key``, else the key in ``weights.verify_key_file``, else the one a learner
    sharing ``storage_dir`` wrote, if any; ConfigError when one is set and unusable."""
    if weights.verify_key:
        try:
            return parse_verify_key(weights.verify_key)
        except ValueError as exc:
            raise ConfigError(f"{prefix}.verify_key: {exc}") from None
    path = Path(weights.verify_key_file) if weights.verify_key_file else None
    if path is None and default_public_path(storage_dir).is_file():
        path = default_public_path(storage_dir)
    if path is None:
        return None
    try:
        return parse_verify_key(read_key_file(path))
    except OSError as exc:
        raise ConfigError(f"{prefix}.verify_key_file: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{prefix}.verify_key_file: {path}: {exc}") from None


def _wait_for_shared_key(path: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    if path.is_file() or wait_s <= 0:
        return
    log.info("no weights.verify_key set: waiting up to %.0f s for the learner's public key in %s",
             wait_s, path)  # fmt: skip
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
