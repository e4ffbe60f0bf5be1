"""``WeightSubscriber``: keep any Keras model in any process on livefit's newest weights.

    model = build_my_model()          # same architecture as the learner's model
    with WeightSubscriber(model, "mqtt://broker:1883", "demo", verify_key="<learner's key>") as w:
        w.wait_for_version(1, timeout=30)
        action = w.predict(observation)        # never sees half-updated weights

``verify_key`` is the learner's Ed25519 public key: base64 of the raw 32 bytes (the learner
logs it at start), PEM text, or a path to a file holding either (the learner writes
``<storage.dir>/keys/weights-signing.pub``). It verifies every message exactly as a replica
does (signature over topic, model, lineage, version and sha256; the payload's structure, model
name, architecture fingerprint and finite values; freshness), then swaps the weights under
``lock``. Without a key it refuses to start unless ``allow_unsigned=True``.

Versions are compared within a lineage; when the learner starts a new lineage (restarted with
new storage) the subscriber follows it and counts ``outcomes["new_lineage"]``, so ``version``
may go down then. Predict through ``predict`` or inside ``with weights.lock:`` to never run on
half-updated weights; or pass ``auto_apply=False`` and call ``apply_pending()`` where your loop
can take new weights (an RL actor between episodes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from livefit.models.builders import weight_names
from livefit.server.config.broker_urls import parse_broker_urls
from livefit.server.config.sections import BrokerSettings
from livefit.server.weights.format import WeightsMeta, architecture_fingerprint
from livefit.server.weights.keys import VerifyKey, parse_verify_key, read_key_file
from livefit.server.weights.receiver import WeightReceiver
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.verifier import DEFAULT_MAX_PULL_BYTES, ReceivedWeights


class WeightSubscriber:
    """Subscribes ``model`` to ``livefit/<model_name>/weights`` (or ``topic``)."""

    def __init__(
        self,
        model: Any,
        broker_url: str,
        model_name: str,
        hmac_key: bytes | str | None = None,
        on_update: Callable[[WeightsMeta], None] | None = None,
        *,
        verify_key: str | bytes | Path | None = None,
        allow_unsigned: bool = False,
        topic: str | None = None,
        auto_apply: bool = True,
        client_id: str = "",
        tls: dict[str, Any] | None = None,
        protocol: str = "5",
        keepalive_s: int = 30,
        pull_url: str | None = None,
        pull_token: str | None = None,
        max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES,
        max_age_s: float = 86400.0,
    ) -> None:
        self.model = model
        self.model_name = model_name
        self.on_update = on_update
        self.auto_apply = auto_apply
        self.lock = threading.RLock()
        self.version: int | None = None
        self.lineage: str | None = None
        self.meta: WeightsMeta | None = None
        self.outcomes: dict[str, int] = {}
        self._pending: ReceivedWeights | None = None
        self._changed = threading.Condition(self.lock)
        key = hmac_key.encode() if isinstance(hmac_key, str) else hmac_key
        public = _verify_key(verify_key)
        if public is None and key is None and not allow_unsigned:
            raise ValueError(
                "WeightSubscriber needs verify_key (the learner's public key: it logs it at "
                "start, and writes <storage.dir>/keys/weights-signing.pub), or hmac_key; or "
                "allow_unsigned=True on a trusted network"
            )
        broker = BrokerSettings.model_validate(
            {"protocol": protocol, "keepalive_s": keepalive_s, "tls": tls or {}}
        )
        self._receiver = WeightReceiver(
            address=parse_broker_urls(broker_url),
            model=model_name,
            topic=topic or f"livefit/{model_name}/weights",
            fingerprint=architecture_fingerprint(weight_names(model), model.get_weights()),
            on_weights=self._received,
            auth=Authenticator(public, key, allow_unsigned=allow_unsigned),
            on_outcome=self._count,
            broker=broker,
            client_id=client_id,
            pull_url=pull_url,
            pull_headers={"Authorization": f"Bearer {pull_token}"} if pull_token else None,
            max_pull_bytes=max_pull_bytes,
            max_age_s=max_age_s,
        )

    def start(self) -> WeightSubscriber:
        self._receiver.start()
        return self

    def stop(self) -> None:
        self._receiver.stop()

    def __enter__(self) -> WeightSubscriber:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def connected(self) -> bool:
        return self._receiver.connected.is_set()

    def wait_for_version(self, version: int = 0, timeout: float | None = None) -> bool:
        """Block until weights at ``version`` or newer (of any lineage) are applied (or
        pending, without auto-apply); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._newest() >= version, timeout)

    def wait_for(self, predicate: Callable[[WeightSubscriber], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds after some weights arrived; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def apply_pending(self) -> bool:
        """Apply the newest verified weights not yet applied; True if the model changed."""
        with self.lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return False
            self._apply(pending)
            return True

    def predict(self, x: Any) -> np.ndarray:
        """``model(x)`` under the lock: never on half-updated weights."""
        with self.lock:
            return np.asarray(self.model(np.asarray(x, dtype=np.float32), training=False))

    def _received(self, received: ReceivedWeights) -> None:
        with self._changed:
            if self.auto_apply:
                self._apply(received)
            else:
                self._pending = received
            self._changed.notify_all()

    def _apply(self, received: ReceivedWeights) -> None:
        self.model.set_weights(received.arrays)
        self.version = received.meta.version
        self.lineage = received.meta.lineage
        self.meta = received.meta
        if self.on_update is not None:
            self.on_update(received.meta)

    def _newest(self) -> int:
        pending = self._pending.meta.version if self._pending is not None else -1
        return max(pending, self.version if self.version is not None else -1)

    def _count(self, outcome: str) -> None:
        with self._changed:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            self._changed.notify_all()


def _verify_key(value: str | bytes | Path | None) -> VerifyKey | None:
    """A public key given as text (base64, hex, PEM), raw bytes, or a path to a file."""
    if value is None:
        return None
    if isinstance(value, str) and not value.lstrip().startswith("-----") and Path(value).is_file():
        value = Path(value)
    if isinstance(value, Path):
        return parse_verify_key(read_key_file(value))
    return parse_verify_key(value)
