"""Receiving side of the weight stream, shared by replicas and the client ``WeightSubscriber``.

A ``WeightReceiver`` subscribes to one model's weight topic with its own paho client. The
network thread only enqueues; a worker thread verifies each message (sha256, HMAC when a key is
set, safetensors structure, model name, architecture fingerprint, finite values), pulls the
payload over HTTP when the message is a manifest, skips versions not newer than the last one
accepted, and hands accepted weights to ``on_weights``. Refusals are counted by outcome via
``on_outcome`` and never stop the receiver.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.broker import BrokerAddress
from livefit.server.config import TlsSettings
from livefit.server.mqtt import apply_credentials
from livefit.server.weight_format import (
    MANIFEST_CONTENT_TYPE,
    WeightsMeta,
    WeightsRejected,
    check_arrays,
    decode_manifest,
    decode_weights,
    verify,
)

log = logging.getLogger(__name__)
OUTCOMES = (
    "accepted", "stale", "bad_sha256", "bad_hmac", "unsigned", "bad_payload", "wrong_model",
    "wrong_architecture", "non_finite", "pull_failed",
)  # fmt: skip
_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class ReceivedWeights:
    """Verified weights, in the local model's order, with what the payload says of itself."""

    arrays: list[np.ndarray]
    meta: WeightsMeta
    payload: bytes
    received_at: float


@dataclass(frozen=True, slots=True)
class _Incoming:
    payload: bytes
    content_type: str | None
    user_properties: dict[str, str]


class WeightReceiver:
    """Subscribes to ``topic`` and delivers verified, newer weights to ``on_weights``."""

    def __init__(
        self,
        address: BrokerAddress,
        model: str,
        topic: str,
        fingerprint: str,
        on_weights: Callable[[ReceivedWeights], None],
        on_outcome: Callable[[str], None] | None = None,
        hmac_key: bytes | None = None,
        client_id: str = "",
        tls: dict[str, Any] | None = None,
        pull_timeout_s: float = 30.0,
        pull_headers: dict[str, str] | None = None,
    ) -> None:
        self.address = address
        self.model = model
        self.topic = topic
        self.fingerprint = fingerprint
        self.on_weights = on_weights
        self.on_outcome = on_outcome
        self.hmac_key = hmac_key
        self.pull_timeout_s = pull_timeout_s
        self.pull_headers = pull_headers or {}
        self.version: int | None = None
        self.connected = threading.Event()
        self._inbox: queue.Queue[_Incoming] = queue.Queue(maxsize=64)
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None
        self._client = self._make_client(client_id, tls or {})

    def start(self) -> None:
        self._worker = threading.Thread(
            target=self._run, name=f"weights-in-{self.model}", daemon=True
        )
        self._worker.start()
        self._client.connect_async(self.address.host, self.address.port, keepalive=30)
        self._client.loop_start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
            self.connected.clear()
        if self._worker is not None:
            self._worker.join(timeout)
            self._worker = None

    def handle(self, incoming: _Incoming) -> ReceivedWeights:
        """Verify one message and return its weights; raise WeightsRejected otherwise."""
        payload = incoming.payload
        props = incoming.user_properties
        verify(self.topic, payload, props.get("sha256"), props.get("hmac"), self.hmac_key)
        if incoming.content_type == MANIFEST_CONTENT_TYPE or payload.startswith(b'{"kind"'):
            payload = self._pull(payload)
        names, arrays, meta = decode_weights(payload)
        if meta.model != self.model:
            raise WeightsRejected("wrong_model", f"weights are for model {meta.model!r}")
        if self.version is not None and meta.version <= self.version:
            raise WeightsRejected(
                "stale", f"version {meta.version} is not newer than {self.version}"
            )
        check_arrays(arrays, self.fingerprint, names, meta)
        return ReceivedWeights(arrays, meta, payload, time.time())

    def _pull(self, manifest_payload: bytes) -> bytes:
        """Fetch a manifest's payload over HTTP and check it against the manifest's sha256."""
        manifest = decode_manifest(manifest_payload)
        if self.version is not None and manifest.version <= self.version:
            raise WeightsRejected("stale", f"version {manifest.version} is not newer")
        try:
            response = httpx.get(
                manifest.url, timeout=self.pull_timeout_s, headers=self.pull_headers
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise WeightsRejected("pull_failed", f"GET {manifest.url}: {exc}") from None
        payload = response.content
        if len(payload) != manifest.size:
            raise WeightsRejected(
                "pull_failed", f"got {len(payload)} bytes, manifest says {manifest.size}"
            )
        verify(self.topic, payload, manifest.sha256, None, None)
        return payload

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                incoming = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            self._process(incoming)

    def _process(self, incoming: _Incoming) -> None:
        try:
            received = self.handle(incoming)
        except WeightsRejected as exc:
            self._count(exc.outcome)
            level = logging.DEBUG if exc.outcome == "stale" else logging.WARNING
            log.log(
                level,
                "weights for %s refused (%s); keeping version %s",
                self.model,
                exc,
                self.version,
            )
            return
        except Exception:
            self._count("bad_payload")
            log.exception("weights for %s could not be processed", self.model)
            return
        try:
            self.on_weights(received)
        except Exception:
            self._count("bad_payload")
            log.exception("applying weights v%d of %s failed", received.meta.version, self.model)
            return
        self.version = received.meta.version
        self._count("accepted")

    def _count(self, outcome: str) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def _make_client(self, client_id: str, tls: dict[str, Any]) -> paho.Client:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        client.suppress_exceptions = True
        client.reconnect_delay_set(1, 5)
        apply_credentials(client, self.address, TlsSettings.model_validate(tls))
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        if reason.is_failure:
            log.error("weight stream: connection to %s refused: %s", self.address, reason)
            return
        client.subscribe(self.topic, qos=1)
        self.connected.set()

    def _on_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        self.connected.clear()

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        try:
            props = message.properties
            user = dict(getattr(props, "UserProperty", []) or []) if props else {}
            content_type = getattr(props, "ContentType", None) if props else None
            incoming = _Incoming(bytes(message.payload), content_type, user)
            try:
                self._inbox.put_nowait(incoming)
            except queue.Full:  # only the newest matters: drop the oldest waiting message
                self._inbox.get_nowait()
                self._inbox.put_nowait(incoming)
        except Exception:
            log.exception("could not enqueue a weights message")
