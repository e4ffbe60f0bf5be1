"""Learner side of the weight stream: every snapshot, encoded once, signed, retained on MQTT.

A ``WeightPublisher`` listens to a model's ``SnapshotSlot``. Its own thread takes the newest
snapshot (older ones that were never sent are skipped: receivers only want the newest),
encodes it as safetensors and publishes it QoS 1, retained, inside a signed envelope
(``weight_format``: Ed25519 over topic, model, lineage, version, times, size and sha256; plus an
HMAC with ``weights.hmac_key``). Nothing rides in MQTT 5 properties, so the stream works over
MQTT 3.1.1 too. A payload over ``max_inline_bytes`` is announced by a signed manifest instead
(the same header, no body) and served from ``GET /v1/models/{name}/weights``. While the broker
is unreachable nothing piles up: the newest snapshot goes out once it is back.

Every ``refresh_interval_s`` without a new snapshot, the newest one is published again with a
new ``signed_at`` (same bytes, same ``created_at``): receivers that limit the age of what they
accept (``weights.max_age_s``) keep accepting an idle learner's retained weights.

The encoded snapshots kept for HTTP pulls are ``weight_store``'s (``EncodedWeights`` and
``WeightStore`` are re-exported here: ``server/api`` imports them from this module), the log
lines about the versions ``version_log``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from livefit.server.latest_worker import LatestWorker
from livefit.server.messaging.mqtt import MqttConnection
from livefit.server.metrics import Metrics
from livefit.server.snapshot import Snapshot
from livefit.server.weights.version_log import VersionLog
from livefit.server.weights.weight_format import (
    ENVELOPE_CONTENT_TYPE,
    EnvelopeHeader,
    WeightsMeta,
    encode_weights,
    sha256_hex,
)
from livefit.server.weights.weight_keys import SigningKey
from livefit.server.weights.weight_store import EncodedWeights, WeightStore

log = logging.getLogger(__name__)
_REFRESH_POLL_S = 1.0

__all__ = ["EncodedWeights", "WeightPublisher", "WeightStore"]


class WeightPublisher:
    """Publishes one model's snapshots on its weight topic and keeps them for HTTP pulls."""

    def __init__(
        self,
        model: str,
        topic: str,
        names: list[str],
        fingerprint: str,
        connection: MqttConnection,
        metrics: Metrics,
        store: WeightStore,
        signer: SigningKey,
        max_inline_bytes: int,
        hmac_key: bytes | None = None,
        refresh_interval_s: float = 3600.0,
        publish_interval_s: float = 0.0,
    ) -> None:
        """Snapshots offered faster than ``publish_interval_s`` wait (only the newest): the
        topic gets at most one per interval, and the last one always goes out on ``stop``."""
        self.model = model
        self.topic = topic
        self.names = names
        self.fingerprint = fingerprint
        self.connection = connection
        self.metrics = metrics
        metrics.export("weights_published", "freshness", "errors")
        self.store = store
        self.signer = signer
        self.hmac_key = hmac_key
        self.max_inline_bytes = max_inline_bytes
        self.refresh_interval_s = refresh_interval_s
        self._encode_lock = threading.Lock()
        self._last_encoded: tuple[Snapshot, EncodedWeights] | None = None
        self.published_version: int | None = None
        self.publish_interval_s = publish_interval_s
        self._published_at = -float("inf")  # monotonic time of the last publish
        self._stopping = False
        self._worker: LatestWorker[Snapshot] = LatestWorker(
            f"weights-{model}", self._publish_safely, ready=self._due
        )
        self._last_info: Any = None
        self._send_lock = threading.Lock()
        self._last_sent: EncodedWeights | None = None
        self._last_sent_at = 0.0
        self._stop_refresh = threading.Event()
        self._refresher: threading.Thread | None = None
        self._versions = VersionLog(log, f"weights {model}", "published")

    def offer(self, snapshot: Snapshot) -> None:
        """Hand a new snapshot over (called from the trainer thread; returns at once)."""
        self._worker.offer(snapshot)

    def _due(self) -> bool:
        """Connected, and the interval since the last publish passed (or stopping)."""
        if not self.connection.connected.is_set():
            return False
        return self._stopping or time.monotonic() - self._published_at >= self.publish_interval_s

    def start(self) -> None:
        self._worker.start()
        self._refresher = threading.Thread(
            target=self._refresh_loop, name=f"weights-refresh-{self.model}", daemon=True
        )
        self._refresher.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Publish what is pending (if connected), then stop and wait for the broker's ack."""
        self._stop_refresh.set()
        if self._refresher is not None:
            self._refresher.join(timeout)
            self._refresher = None
        self._stopping = True
        self._worker.stop(timeout)
        if self._last_info is not None:
            try:
                self._last_info.wait_for_publish(timeout)
            except (RuntimeError, ValueError):
                log.warning("final weights of %s were not acknowledged by the broker", self.model)
        self._versions.flush()

    def _publish_safely(self, snapshot: Snapshot) -> None:
        try:
            self.publish(snapshot)
        except Exception:
            self.metrics.internal_errors.labels(component="weight_publisher").inc()
            log.exception("could not publish weights of %s v%d", self.model, snapshot.version)

    def publish(self, snapshot: Snapshot) -> EncodedWeights:
        """Encode, keep and publish ``snapshot``; returns what was encoded."""
        started = time.perf_counter()
        self._published_at = time.monotonic()
        encoded = self.encode(snapshot)
        self.store.add(encoded)
        kind = self._send(encoded)
        self._record(snapshot, encoded, kind, time.perf_counter() - started)
        return encoded

    def encode(self, snapshot: Snapshot) -> EncodedWeights:
        """``snapshot`` as the weight format's bytes with their hash. The newest encoding is
        kept, so the weight topic and a split learner's local feed, handed the same snapshot,
        encode it once between them (thread-safe)."""
        with self._encode_lock:
            last = self._last_encoded
            if last is not None and last[0] is snapshot:
                return last[1]
        encoded = self._encode(snapshot)
        with self._encode_lock:
            self._last_encoded = (snapshot, encoded)
        return encoded

    def _encode(self, snapshot: Snapshot) -> EncodedWeights:
        meta = WeightsMeta(
            model=self.model,
            version=snapshot.version,
            samples_seen=snapshot.samples_seen,
            created_at=snapshot.created_at,
            newest_published_at=snapshot.newest_published_at,
            fingerprint=self.fingerprint,
            lineage=snapshot.lineage,
        )
        payload = encode_weights(self.names, snapshot.weights, meta)
        return EncodedWeights(
            snapshot.version, payload, sha256_hex(payload), snapshot.created_at, snapshot.lineage
        )

    def seal(
        self, encoded: EncodedWeights, signed_at: float, *, inline: bool | None = None
    ) -> tuple[bytes, str]:
        """The signed envelope for ``encoded``: inline, or a manifest when over
        ``max_inline_bytes`` (``inline`` given: that, whatever the size)."""
        if inline is None:
            inline = len(encoded.payload) <= self.max_inline_bytes
        header = EnvelopeHeader(
            kind="weights" if inline else "manifest",
            topic=self.topic,
            model=self.model,
            lineage=encoded.lineage,
            version=encoded.version,
            created_at=encoded.created_at,
            signed_at=signed_at,
            size=len(encoded.payload),
            sha256=encoded.sha256,
            fingerprint=self.fingerprint,
            key_id=self.signer.key_id,
        )
        body = encoded.payload if inline else b""
        return self.signer.seal(header, body, self.hmac_key), "inline" if inline else "manifest"

    def _send(self, encoded: EncodedWeights) -> str:
        with self._send_lock:
            data, kind = self.seal(encoded, time.time())
            self._last_info = self.connection.publish(
                self.topic, data, qos=1, retain=True, content_type=ENVELOPE_CONTENT_TYPE
            )
            self._last_sent, self._last_sent_at = encoded, time.monotonic()
            return kind

    def _refresh_loop(self) -> None:
        while not self._stop_refresh.wait(min(self.refresh_interval_s, _REFRESH_POLL_S)):
            try:
                self._refresh_if_due()
            except Exception:
                self.metrics.internal_errors.labels(component="weight_publisher").inc()
                log.exception("could not re-sign the weights of %s", self.model)

    def _refresh_if_due(self) -> None:
        with self._send_lock:
            last = self._last_sent
            due = time.monotonic() - self._last_sent_at >= self.refresh_interval_s
            if last is None or not due or not self.connection.connected.is_set():
                return
            data, _ = self.seal(last, time.time())
            self._last_info = self.connection.publish(
                self.topic, data, qos=1, retain=True, content_type=ENVELOPE_CONTENT_TYPE
            )
            self._last_sent_at = time.monotonic()
        self.metrics.weights_published.labels(model=self.model, kind="refresh").inc()
        log.debug("weights %s v%d re-signed and published again", self.model, last.version)

    def _record(
        self, snapshot: Snapshot, encoded: EncodedWeights, kind: str, seconds: float
    ) -> None:
        m = self.metrics
        self.published_version = snapshot.version
        m.weights_published.labels(model=self.model, kind=kind).inc()
        m.weights_publish_seconds.labels(model=self.model).observe(seconds)
        m.weights_payload_bytes.labels(model=self.model).set(len(encoded.payload))
        m.published_version.labels(model=self.model).set(snapshot.version)
        if snapshot.newest_published_at is not None:
            freshness = max(0.0, time.time() - snapshot.newest_published_at)
            m.freshness.labels(model=self.model, stage="published").observe(freshness)
        size, ms = len(encoded.payload), seconds * 1000
        self._versions.record(
            snapshot.version,
            f"weights {self.model} v{snapshot.version} published "
            f"({kind}, {size} bytes, {ms:.1f} ms)",
            f"; the last {kind}, {size} bytes, {ms:.1f} ms",
        )
