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
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from livefit.server.latest_worker import LatestWorker
from livefit.server.messaging.mqtt import MqttConnection
from livefit.server.metrics import Metrics
from livefit.server.snapshot import Snapshot
from livefit.server.weights.weight_format import (
    ENVELOPE_CONTENT_TYPE,
    EnvelopeHeader,
    WeightsMeta,
    encode_weights,
    sha256_hex,
)
from livefit.server.weights.weight_keys import SigningKey

log = logging.getLogger(__name__)
_REFRESH_POLL_S = 1.0
SUMMARY_INTERVAL_S = 30.0  # at INFO, one line per this long about the versions that went by


class VersionLog:
    """Logs a stream of versions (several a second) without flooding the log.

    Every version is logged at DEBUG. At INFO: the first one at once, then one summary line
    per ``interval_s`` with the count and the version range (written when the next version
    comes after the interval, or on ``flush``).
    """

    def __init__(
        self,
        logger: logging.Logger,
        subject: str,
        verb: str,
        interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.subject, self.verb = logger, subject, verb
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the last INFO line was written
        self._count = 0
        self._low = self._high = 0
        self._detail = ""

    def record(self, version: int, message: str, detail: str = "") -> None:
        """One new ``version``: ``message`` is its own line, ``detail`` goes in summaries."""
        self.logger.debug("%s", message)
        with self._lock:
            now = self._clock()
            if self._since is None:
                self._since = now
                line: str | None = message
            else:
                self._add(version, detail)
                line = self._take(now) if now - self._since >= self.interval_s else None
        if line is not None:
            self.logger.info("%s", line)

    def flush(self) -> None:
        """Write the summary of what was not summarised yet (at shutdown)."""
        with self._lock:
            line = self._take(self._clock()) if self._count else None
        if line is not None:
            self.logger.info("%s", line)

    def _add(self, version: int, detail: str) -> None:
        if self._count == 0:
            self._low = self._high = version
        self._low, self._high = min(self._low, version), max(self._high, version)
        self._count += 1
        self._detail = detail

    def _take(self, now: float) -> str:
        seconds = now - (self._since if self._since is not None else now)
        versions = "version" if self._count == 1 else "versions"
        line = (
            f"{self.subject}: {self._count} {versions} {self.verb} in the last {seconds:.0f} s "
            f"(v{self._low} to v{self._high}{self._detail})"
        )
        self._since, self._count, self._detail = now, 0, ""
        return line


@dataclass(frozen=True, slots=True)
class EncodedWeights:
    """One snapshot as it travels: the safetensors bytes and their digest."""

    version: int
    payload: bytes
    sha256: str
    created_at: float
    lineage: str = ""


class WeightStore:
    """The last few encoded snapshots of one model, for ``GET /v1/models/{name}/weights``.

    Only one lineage is kept: a snapshot of another lineage replaces everything, so that a
    ``?version=N`` never answers with another history's version N.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._items: OrderedDict[int, EncodedWeights] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, item: EncodedWeights) -> None:
        with self._lock:
            newest = next(reversed(self._items.values()), None)
            if newest is not None and newest.lineage != item.lineage:
                self._items.clear()
            self._items.pop(item.version, None)
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
        self.store = store
        self.signer = signer
        self.hmac_key = hmac_key
        self.max_inline_bytes = max_inline_bytes
        self.refresh_interval_s = refresh_interval_s
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
            m.freshness.labels(model=self.model).observe(freshness)
        size, ms = len(encoded.payload), seconds * 1000
        self._versions.record(
            snapshot.version,
            f"weights {self.model} v{snapshot.version} published "
            f"({kind}, {size} bytes, {ms:.1f} ms)",
            f"; the last {kind}, {size} bytes, {ms:.1f} ms",
        )
