"""``WeightSubscriber``: keep any Keras model in any process on livefit's newest weights.

    model = build_my_model()          # same architecture as the learner's model
    with WeightSubscriber(model, "mqtt://broker:1883", "demo", hmac_key=b"...") as weights:
        weights.wait_for_version(1, timeout=30)
        action = weights.predict(observation)        # never sees half-updated weights

It verifies every message exactly as a replica does (sha256, HMAC when a key is given,
safetensors structure, model name, architecture fingerprint, finite values), then swaps the
weights under ``lock``. Predict through ``predict`` or inside ``with weights.lock:`` to never
run on half-updated weights; or pass ``auto_apply=False`` and call ``apply_pending()`` where
your loop can take new weights (an RL actor between episodes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from livefit.models import weight_names
from livefit.server.broker import parse_broker_url
from livefit.server.weight_format import WeightsMeta, architecture_fingerprint
from livefit.server.weight_receiver import ReceivedWeights, WeightReceiver


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
        topic: str | None = None,
        auto_apply: bool = True,
        client_id: str = "",
        tls: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.model_name = model_name
        self.on_update = on_update
        self.auto_apply = auto_apply
        self.lock = threading.RLock()
        self.version: int | None = None
        self.meta: WeightsMeta | None = None
        self.outcomes: dict[str, int] = {}
        self._pending: ReceivedWeights | None = None
        self._changed = threading.Condition(self.lock)
        key = hmac_key.encode() if isinstance(hmac_key, str) else hmac_key
        self._receiver = WeightReceiver(
            address=parse_broker_url(broker_url),
            model=model_name,
            topic=topic or f"livefit/{model_name}/weights",
            fingerprint=architecture_fingerprint(weight_names(model), model.get_weights()),
            on_weights=self._received,
            on_outcome=self._count,
            hmac_key=key,
            client_id=client_id,
            tls=tls,
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
        """Block until weights at ``version`` or newer are applied (or pending, without
        auto-apply); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._newest() >= version, timeout)

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
        self.meta = received.meta
        if self.on_update is not None:
            self.on_update(received.meta)

    def _newest(self) -> int:
        pending = self._pending.meta.version if self._pending is not None else -1
        return max(pending, self.version if self.version is not None else -1)

    def _count(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
