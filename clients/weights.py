"""``WeightSubscriber``: livefit's newest model in any process, from the weight stream alone.

    with WeightSubscriber("mqtt://broker:1883", "demo", verify_key="<learner's key>") as w:
        w.wait_for_version(1, timeout=30)      # TimeoutError if it does not come
        action = w.predict(observation)        # never on half-updated weights

Three facts are enough: the broker, the model's name and the learner's public key (or, where
no broker is reachable, the learner's URL and token: ``WeightSubscriber(model_name="demo",
pull_url="https://learner:8000", pull_token=..., verify_key=...)`` polls its HTTP and verifies
each snapshot's signed envelope the same way, ``weights.poller``). Every
snapshot carries the network's description (``livefit.models.description``, bound by the
signature), and the subscriber builds the network from it: Keras' own serialization of the
whole model, input and target scaling included, so ``predict`` answers as the learner's serving
does. It predicts through the runtime the learner serves with (``serve.runtime = "auto"``: a
NumPy forward pass for Dense chains, else the Keras graph), so at the same version the numbers
are the learner's. A snapshot whose description differs from the network held (the learner
restarted with another config) is built anew, not refused. A network is built from a
description only after its signature verified, from Keras' own classes (less those that run
code or load files) and classes registered as serializable in this process, in Keras'
``safe_mode``; one that cannot be built is refused (``outcomes["bad_description"]``) and the
subscriber keeps what it had.

``verify_key`` is the learner's Ed25519 public key: base64 of the raw 32 bytes (the learner
logs it at start), PEM text, or a path to a file holding either (the learner writes
``<storage.dir>/keys/weights-signing.pub``). It verifies every message exactly as a replica
does (signature over topic, model, lineage, version, sha256 and description; the payload's
structure, model name, architecture fingerprint and finite values; freshness). Without a key
it refuses to start unless ``allow_unsigned=True``.

``model=`` (optional) is a Keras model of your own to keep in step: it is used while the stream's
architecture fingerprint matches it (and for a learner too old to publish descriptions); a
snapshot of another architecture is built from its description instead.

Versions are compared within a lineage; when the learner starts a new lineage (restarted with
new storage) the subscriber follows it and counts ``outcomes["new_lineage"]``, so ``version``
may go down then. ``predict`` swaps versions between calls, never during one; ``on_update``
hears each version once it is in place. Pass ``auto_apply=False`` and call ``apply_pending()``
where your loop can take new weights (an RL actor between episodes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np

from livefit.models.builders import weight_names
from livefit.models.description import DescriptionError, model_from_description
from livefit.server.config.broker_urls import parse_broker_urls
from livefit.server.config.sections import BrokerSettings
from livefit.server.serve.runtimes import GraphRuntime, Runtime, build_runtime
from livefit.server.weights.format import (
    WeightsMeta,
    WeightsRejected,
    architecture_fingerprint,
    description_sha256,
)
from livefit.server.weights.keys import VerifyKey, parse_verify_key, read_key_file
from livefit.server.weights.poller import WeightPoller
from livefit.server.weights.receiver import WeightReceiver
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.verifier import (
    DEFAULT_MAX_PULL_BYTES,
    ReceivedWeights,
    WeightVerifier,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Network:
    """A network this subscriber can run: the Keras model, the runtime that computes it, what
    it was built from."""

    model: keras.Model
    runtime: Runtime
    fingerprint: str
    description_sha256: str  # "" for the caller's own model


class WeightSubscriber:
    """Follows ``livefit/<model_name>/weights`` (or ``topic``) and predicts with the newest."""

    def __init__(
        self,
        broker_url: str | Sequence[str] | None = None,
        model_name: str = "",
        *,
        verify_key: str | bytes | Path | None = None,
        hmac_key: bytes | str | None = None,
        model: keras.Model | None = None,
        on_update: Callable[[WeightsMeta], None] | None = None,
        allow_unsigned: bool = False,
        topic: str | None = None,
        auto_apply: bool = True,
        runtime: str = "auto",
        client_id: str = "",
        tls: dict[str, Any] | None = None,
        protocol: str = "5",
        keepalive_s: int = 30,
        pull_url: str | None = None,
        pull_token: str | None = None,
        max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES,
        max_age_s: float = 86400.0,
        poll_interval_s: float = 1.0,
    ) -> None:
        """``broker_url`` (a URL, a list, or URLs separated by commas) follows the weight
        topic; without it, ``pull_url`` (and ``pull_token``) polls the learner's HTTP every
        ``poll_interval_s`` instead. See the module docstring for the rest."""
        if not isinstance(broker_url, str | list | tuple | None) or not isinstance(model_name, str):
            raise TypeError(
                "WeightSubscriber(broker_url, model_name, verify_key=...): the model is "
                "optional now and goes by keyword (model=...)"
            )
        if not model_name or (broker_url is None and pull_url is None):
            raise ValueError("WeightSubscriber needs the model's name and a broker_url or pull_url")
        self.model_name = model_name
        self.on_update = on_update
        self.auto_apply = auto_apply
        self.runtime_choice = runtime
        self.lock = threading.RLock()
        self.version: int | None = None
        self.lineage: str | None = None
        self.meta: WeightsMeta | None = None
        self.outcomes: dict[str, int] = {}
        self._own = self._network(model, "") if model is not None else None
        self._network_in_use: _Network | None = None
        self._pending: tuple[ReceivedWeights, _Network] | None = None
        self._changed = threading.Condition(self.lock)
        key = hmac_key.encode() if isinstance(hmac_key, str) else hmac_key
        public = _verify_key(verify_key)
        if public is None and key is None and not allow_unsigned:
            raise ValueError(
                "WeightSubscriber needs verify_key (the learner's public key: it logs it at "
                "start, and writes <storage.dir>/keys/weights-signing.pub), or hmac_key; or "
                "allow_unsigned=True on a trusted network"
            )
        verification: dict[str, Any] = {
            "model": model_name,
            "topic": topic or f"livefit/{model_name}/weights",
            "fingerprint": None,  # any architecture: the network is built from the description
            "on_weights": self._received,
            "auth": Authenticator(public, key, allow_unsigned=allow_unsigned),
            "on_outcome": self._count,
            "max_pull_bytes": max_pull_bytes,
            "max_age_s": max_age_s,
        }
        headers = {"Authorization": f"Bearer {pull_token}"} if pull_token else None
        self._receiver: WeightVerifier
        if broker_url is None:
            assert pull_url is not None
            self._receiver = WeightPoller(
                pull_url, **verification, headers=headers, poll_interval_s=poll_interval_s
            )
        else:
            broker = BrokerSettings.model_validate(
                {"protocol": protocol, "keepalive_s": keepalive_s, "tls": tls or {}}
            )
            self._receiver = WeightReceiver(
                parse_broker_urls(broker_url), **verification, broker=broker, client_id=client_id,
                pull_url=pull_url, pull_headers=headers,
            )  # fmt: skip

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

    @property
    def model(self) -> keras.Model | None:
        """The Keras model in use (its weights are the current version's), or None before
        the first weights."""
        network = self._network_in_use or self._own
        return network.model if network is not None else None

    def wait_for_version(self, version: int = 0, timeout: float | None = None) -> int:
        """Block until weights at ``version`` or newer (of any lineage) are applied (or
        pending, without auto-apply); returns that version. ``TimeoutError`` after
        ``timeout`` seconds, saying what was received and refused meanwhile."""
        self.wait_for(lambda s: s._newest() >= version, timeout, f"version {version}")
        return self._newest()

    def wait_for(
        self,
        predicate: Callable[[WeightSubscriber], bool],
        timeout: float | None,
        what: str = "the condition",
    ) -> bool:
        """Block until ``predicate(self)`` holds after some weights arrived; True then,
        ``TimeoutError`` after ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self), timeout):
                raise TimeoutError(f"{self.model_name}: no {what} within {timeout} s; "
                                   f"{self._state()}")  # fmt: skip
        return True

    def apply_pending(self) -> bool:
        """Apply the newest verified weights not yet applied; True if the model changed."""
        with self.lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        self._apply(*pending)
        return True

    def predict(self, x: Any) -> np.ndarray:
        """The current version's outputs for the rows ``x`` (a batch of inputs): never on
        half-updated weights. ``RuntimeError`` before the first weights."""
        return self.predict_with_version(x)[0]

    def predict_with_version(self, x: Any) -> tuple[np.ndarray, int]:
        """``predict(x)`` and the version that computed it."""
        rows = np.asarray(x, dtype=np.float32)
        with self.lock:
            network, version = self._network_in_use, self.version
            if network is None or version is None:
                raise RuntimeError(
                    f"{self.model_name}: no weights yet (wait_for_version first); {self._state()}"
                )
            return np.asarray(network.runtime(rows)), version

    # weights arriving (the receiver's thread) ----------------------------------------------
    def _received(self, received: ReceivedWeights) -> None:
        """Build (outside the lock) the network the snapshot needs, then apply or keep it;
        WeightsRejected (counted by the receiver) when that network cannot be had."""
        network = self._network_for(received.meta)
        if self.auto_apply:
            self._apply(received, network)
            return
        with self._changed:
            self._pending = (received, network)
            self._changed.notify_all()

    def _network_for(self, meta: WeightsMeta) -> _Network:
        """The network in use, the caller's own or one built from ``meta``'s description:
        whichever has the snapshot's architecture and description."""
        wanted = description_sha256(meta.description)
        current = self._network_in_use
        for network in (current, self._own):
            if network is None or network.fingerprint != meta.fingerprint:
                continue
            if network.description_sha256 in ("", wanted):
                return network
        if not meta.description:
            raise WeightsRejected(
                "bad_description",
                f"v{meta.version} carries no description (a learner older than this client): "
                "pass model= a network of the learner's architecture",
            )
        try:
            built = self._network(model_from_description(meta.description), wanted)
        except DescriptionError as exc:
            raise WeightsRejected("bad_description", str(exc)) from None
        if built.fingerprint != meta.fingerprint:
            raise WeightsRejected(
                "bad_description",
                f"the network its description builds has weights of another architecture "
                f"({built.fingerprint[:12]}, the snapshot's {meta.fingerprint[:12]}): are its "
                "layers named explicitly?",
            )
        if current is not None:
            log.info("weights of %s: the learner's network changed at v%d; built anew",
                     self.model_name, meta.version)  # fmt: skip
        return built

    def _network(self, model: keras.Model, description: str) -> _Network:
        shape = tuple(model.inputs[0].shape[1:])
        runtime = build_runtime(self.runtime_choice, model, shape, "/CPU:0", self.model_name)
        fingerprint = architecture_fingerprint(weight_names(model), model.get_weights())
        return _Network(model, runtime, fingerprint, description)

    def _apply(self, received: ReceivedWeights, network: _Network) -> None:
        arrays = received.arrays
        with self._changed:
            if not isinstance(network.runtime, GraphRuntime):  # which sets the model's own
                network.model.set_weights(arrays)  # ``model`` shows the version in use
            network.runtime.load(arrays)
            self._network_in_use = network
            self.version = received.meta.version
            self.lineage = received.meta.lineage
            self.meta = received.meta
            self._changed.notify_all()
        if self.on_update is not None:
            self.on_update(received.meta)

    def _newest(self) -> int:
        pending = self._pending[0].meta.version if self._pending is not None else -1
        return max(pending, self.version if self.version is not None else -1)

    def _state(self) -> str:
        refused = self._receiver.last_refused
        return (
            f"{'connected' if self.connected else self._receiver.not_connected_reason()}; "
            f"version {self.version}; outcomes {self.outcomes}"
            + (f"; last refused: {refused}" if refused else "")
        )

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
