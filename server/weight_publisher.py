"""Learner side of the weight stream: every snapshot, encoded once, retained on MQTT.

A ``WeightPublisher`` listens to a model's ``SnapshotSlot``. Its own thread takes the newest
snapshot (older ones that were never sent are skipped: receivers only want the newest),
encodes it as safetensors, and publishes it QoS 1, retained, with content type, version,
sha256 and (with a key) HMAC as MQTT 5 properties. A payload over ``max_inline_bytes`` is
published as a manifest instead, and served from ``GET /v1/models/{name}/weights``. While the
broker is unreachable nothing piles up: the newest snapshot goes out once it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from livefit.server.latest_worker import LatestWorker
from livefit.server.metrics import Metrics
from livefit.server.mqtt import MqttConnection
from livefit.server.snapshot import Snapshot
from livefit.server.weight_format import (
    MANIFEST_CONTENT_TYPE,
    WEIGHTS_CONTENT_TYPE,
    Manifest,
    WeightsMeta,
    encode_manifest,
    encode_weights,
    sha256_hex,
    sign,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EncodedWeights:
    """One snapshot as it travels: the safetensors bytes and their digest."""

    version: int
    payload: bytes
    sha256: str
    created_at: float


class WeightStore:
    """The last few encoded snapshots of one model, for ``GET /v1/models/{name}/weights``."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._items: OrderedDict[int, EncodedWeights] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, item: EncodedWeights) -> None:
        with self._lock:
            self._items[item.version] = item
            while len(self._items) > self.keep:
                self._items.popitem(last=False)

    def get(self, version: int | None = None) -> EncodedWeights | None:
        """The given version if still kept, else None; the newest when ``version`` is None."""
        with self._lock:
            if version is None:
                return next(reversed(self._items.values()), None)
            return self._items.get(version)


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
        hmac_key: bytes | None,
        max_inline_bytes: int,
        pull_url: str,
    ) -> None:
        self.model = model
        self.topic = topic
        self.names = names
        self.fingerprint = fingerprint
        self.connection = connection
        self.metrics = metrics
        self.store = store
        self.hmac_key = hmac_key
        self.max_inline_bytes = max_inline_bytes
        self.pull_url = pull_url
        self.published_version: int | None = None
        self._worker: LatestWorker[Snapshot] = LatestWorker(
            f"weights-{model}", self._publish_safely, ready=connection.connected.is_set
        )
        self._last_info: Any = None

    def offer(self, snapshot: Snapshot) -> None:
        """Hand a new snapshot over (called from the trainer thread; returns at once)."""
        self._worker.offer(snapshot)

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Publish what is pending (if connected), then stop and wait for the broker's ack."""
        self._worker.stop(timeout)
        if self._last_info is not None:
            try:
                self._last_info.wait_for_publish(timeout)
            except (RuntimeError, ValueError):
                log.warning("final weights of %s were not acknowledged by the broker", self.model)

    def _publish_safely(self, snapshot: Snapshot) -> None:
        try:
            self.publish(snapshot)
        except Exception:
            self.metrics.internal_errors.labels(component="weight_publisher").inc()
            log.exception("could not publish weights of %s v%d", self.model, snapshot.version)

    def publish(self, snapshot: Snapshot) -> EncodedWeights:
        """Encode, keep and publish ``snapshot``; returns what was encoded."""
        started = time.perf_counter()
        encoded = self.encode(snapshot)
        self.store.add(encoded)
        if len(encoded.payload) <= self.max_inline_bytes:
            kind = "inline"
            self._send(encoded.payload, WEIGHTS_CONTENT_TYPE, snapshot.version)
        else:
            kind = "manifest"
            manifest = Manifest(
                model=self.model,
                version=snapshot.version,
                size=len(encoded.payload),
                sha256=encoded.sha256,
                url=f"{self.pull_url}/v1/models/{self.model}/weights?version={snapshot.version}",
                created_at=snapshot.created_at,
            )
            self._send(encode_manifest(manifest), MANIFEST_CONTENT_TYPE, snapshot.version)
        self._record(snapshot, encoded, kind, time.perf_counter() - started)
        return encoded

    def encode(self, snapshot: Snapshot) -> EncodedWeights:
        meta = WeightsMeta(
            model=self.model,
            version=snapshot.version,
            samples_seen=snapshot.samples_seen,
            created_at=snapshot.created_at,
            newest_published_at=snapshot.newest_published_at,
            fingerprint=self.fingerprint,
        )
        payload = encode_weights(self.names, snapshot.weights, meta)
        return EncodedWeights(snapshot.version, payload, sha256_hex(payload), snapshot.created_at)

    def _send(self, payload: bytes, content_type: str, version: int) -> None:
        properties = [("model", self.model), ("version", str(version)),
                      ("sha256", sha256_hex(payload))]  # fmt: skip
        if self.hmac_key is not None:
            properties.append(("hmac", sign(self.hmac_key, self.topic, payload)))
        self._last_info = self.connection.publish(
            self.topic, payload, qos=1, retain=True, content_type=content_type,
            user_properties=properties,
        )  # fmt: skip

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
            m.freshness.labels(model=self.model).observe(freshness)
        log.info("weights %s v%d published (%s, %d bytes, %.1f ms)", self.model,
                 snapshot.version, kind, len(encoded.payload), seconds * 1000)  # fmt: skip
