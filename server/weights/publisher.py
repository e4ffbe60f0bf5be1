"""Learner side of the weight stream: every snapshot, encoded once, signed, retained on MQTT.

A ``WeightPublisher`` listens to a model's ``SnapshotSlot``. Its own thread takes the newest
snapshot (older ones that were never sent are skipped: receivers only want the newest),
encodes it as safetensors and publishes it QoS 1, retained, inside a signed envelope
(``weights.format``: Ed25519 over topic, model, lineage, version, times, size and sha256; plus an
HMAC with ``weights.hmac_key``). Nothing rides in MQTT 5 properties, so the stream works over
MQTT 3.1.1 too. A payload over ``max_inline_bytes`` is announced by a signed manifest instead
(the same header, no body) and served from ``GET /v1/models/{name}/weights``. While the broker
is unreachable nothing piles up: the newest snapshot goes out once it is back. An envelope whose
PUBLISH would be over the broker's maximum packet size (MQTT 5 CONNACK, or
``broker.max_packet_size_bytes``) goes out as a manifest too: an oversize packet would make
the broker drop the connection, and ingestion shares it. A manifest itself over that size (a
tiny limit, a long topic) cannot be sent at all: not counted as published but as failed
(``livefit_weights_publish_failed_total``), with an error line saying replicas get no weights
(once, and again after a publish went through). Readiness stays as it is: the learner trains
and serves its own predictions; the replicas, which get nothing, are the ones not ready.

The learner watches its own weight topic: a message there that is not its own (not signed by
its key, or of another lineage, or unsigned, or the retained message deleted: a second learner
of the same model on the broker, or a third party) is logged as an error naming its key id and
lineage, counted (``livefit_weights_foreign_total``), and the learner's newest snapshot is put
back as the retained message at once (then no more often than every 1, 2, 4 ... 60 s while
foreign messages keep coming, so two learners do not flood the topic fighting over it; the gap
starts again from 0 only after a quiet minute past it). Those lines (the foreign retained
message found at subscribe, a WARNING: its learner may be long gone; a foreign message published
while this learner runs, an ERROR: another learner or someone else is publishing now; the put
back) are logged the first time, then at most once a minute each with how many were not.

Every ``refresh_interval_s`` without a new snapshot, the newest one is published again with a
new ``signed_at`` (same bytes, same ``created_at``): receivers that limit the age of what they
accept (``weights.max_age_s``) keep accepting an idle learner's retained weights.

The encoded snapshots kept for HTTP pulls are ``weights.store``'s (``EncodedWeights`` and
``WeightStore`` are re-exported here: ``server/api`` imports them from this module), the log
lines about the versions ``version_log``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from ..base.latest_worker import LatestWorker
from ..base.logs import LogThrottle
from ..base.metrics import ErrorMetrics, Metrics
from ..mqtt.connection import MqttConnection, RawMessage
from ..mqtt.metrics import PublishRefusedMetrics
from ..wire.snapshot import Snapshot
from .format import (
    ENVELOPE_CONTENT_TYPE,
    EnvelopeHeader,
    WeightsMeta,
    WeightsRejected,
    description_sha256,
    encode_weights,
    open_envelope,
    sha256_hex,
)
from .keys import SigningKey
from .metrics import FreshnessMetrics, WeightsPublishedMetrics
from .store import EncodedWeights, WeightStore
from .version_log import VersionLog

log = logging.getLogger(__name__)
_REFRESH_POLL_S = 1.0
RESTORE_GAP_MIN_S = 1.0  # the second restore in a fight waits this long, then twice as long ...
RESTORE_GAP_MAX_S = 60.0  # foreign messages in a row: the snapshot is put back this often at most


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
        description: str = "",
    ) -> None:
        """Snapshots offered faster than ``publish_interval_s`` wait (only the newest): the
        topic gets at most one per interval, and the last one always goes out on ``stop``.
        ``description`` (``livefit.models.description``'s canonical JSON) rides in every
        snapshot, bound by the envelope's ``description_sha256``."""
        self.model = model
        self.topic = topic
        self.names = names
        self.fingerprint = fingerprint
        self.description = description
        self.connection = connection
        self.metrics = metrics
        metrics.group(WeightsPublishedMetrics)
        metrics.group(FreshnessMetrics)
        metrics.group(ErrorMetrics)
        metrics.group(PublishRefusedMetrics)
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
        self._wake = threading.Event()  # the refresh thread's: stop, or a restore is wanted
        self._restore_wanted = False
        self._restored_at = -float("inf")  # monotonic time of the last restore
        self._restore_gap_s = 0.0
        # Apart: a foreign retained message found at subscribe (perhaps a learner long gone)
        # must not hold back the ERROR for one published now (another learner running).
        self._foreign_lines = LogThrottle()
        self._retained_foreign_lines = LogThrottle()
        self._restore_lines = LogThrottle()
        self._said_manifest = False
        self._said_failed = False
        self.serving_record = ""  # the model's serving record, signed into every envelope

    def watch_topic(self) -> None:
        """Subscribe to the weight topic to notice messages that are not this learner's.
        Call before the connection starts."""
        self.connection.add_subscription(self.topic, qos=0, handler=self._seen, no_local=True)

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
        self._wake.set()
        if self._refresher is not None:
            self._refresher.join(timeout)
            self._refresher = None
        self._stopping = True
        self._worker.stop(timeout)
        if self._last_info is not None:  # None: nothing sent, or the last one was over the limit
            try:
                self._last_info.wait_for_publish(timeout)
            except (RuntimeError, ValueError):
                log.warning("final weights of %s were not acknowledged by the broker", self.model)
        self._versions.flush()

    def _publish_safely(self, snapshot: Snapshot) -> None:
        try:
            self.publish(snapshot)
        except Exception:
            self.metrics.group(ErrorMetrics).internal_errors.labels(
                component="weight_publisher"
            ).inc()
            log.exception("could not publish weights of %s v%d", self.model, snapshot.version)

    def publish(self, snapshot: Snapshot) -> EncodedWeights:
        """Encode, keep and publish ``snapshot``; returns what was encoded."""
        started = time.perf_counter()
        self._published_at = time.monotonic()
        encoded = self.encode(snapshot)
        kind = self._send(encoded)  # which keeps it in the store, signed
        if kind is not None:
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
            description=self.description,
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
            description_sha256=description_sha256(self.description),
            serving=self.serving_record,
        )
        body = encoded.payload if inline else b""
        return self.signer.seal(header, body, self.hmac_key), "inline" if inline else "manifest"

    def _send(self, encoded: EncodedWeights) -> str | None:
        with self._send_lock:
            return self._send_locked(encoded)

    def _send_locked(self, encoded: EncodedWeights) -> str | None:
        """Seal ``encoded`` now and publish it retained: inline when its PUBLISH fits the
        broker's maximum packet size and ``max_inline_bytes``, else as a manifest. Returns the
        kind sent, or None when even the manifest is over that size (counted as failed)."""
        data, kind = self.seal(encoded, time.time())
        if kind == "inline" and not self.connection.fits(
            self.topic, data, content_type=ENVELOPE_CONTENT_TYPE
        ):
            inline_bytes = len(data)
            data, kind = self.seal(encoded, time.time(), inline=False)
            if not self._said_manifest:
                self._said_manifest = True
                log.info(
                    "weights %s v%d: %d bytes inline are over the broker's maximum packet size "
                    "(%s bytes): announced by a manifest, replicas pull them over HTTP "
                    "(weights.pull_url)",
                    self.model, encoded.version, inline_bytes, self.connection.guard.limit_bytes,
                )  # fmt: skip
        # In the store before a manifest names it (a receiver pulls it at once), with the
        # envelope HTTP clients verify it by.
        body = len(encoded.payload) if kind == "inline" else 0
        self.store.add(replace(encoded, envelope=data[: len(data) - body]))
        self._last_info = self.connection.publish(
            self.topic, data, qos=1, retain=True, content_type=ENVELOPE_CONTENT_TYPE
        )
        # kept even when not sent: the refresh tries it again (the broker's limit may change)
        self._last_sent, self._last_sent_at = encoded, time.monotonic()
        if self._last_info is None:  # over the limit even as a manifest: the guard counted it
            self._failed(encoded, kind, len(data))
            return None
        self._said_failed = False
        self._restore_wanted = False  # this is back on the topic now
        return kind

    def _failed(self, encoded: EncodedWeights, kind: str, size: int) -> None:
        self.metrics.group(WeightsPublishedMetrics).weights_publish_failed.labels(
            model=self.model
        ).inc()
        if self._said_failed:
            return
        self._said_failed = True
        log.error(
            "weights %s v%d not published: even as a %s (%d bytes) its PUBLISH is over the "
            "broker's maximum packet size (%s bytes; broker max_packet_size, "
            "broker.max_packet_size_bytes): replicas get no weights until a larger limit or a "
            "shorter weights.topic lets it through (livefit_weights_publish_failed_total)",
            self.model, encoded.version, kind, size, self.connection.guard.limit_bytes,
        )  # fmt: skip

    def _refresh_loop(self) -> None:
        while not self._stop_refresh.is_set():
            self._wake.wait(min(self.refresh_interval_s, _REFRESH_POLL_S))
            self._wake.clear()
            if self._stop_refresh.is_set():
                return
            try:
                self._restore_if_due()
                self._refresh_if_due()
            except Exception:
                self.metrics.group(ErrorMetrics).internal_errors.labels(
                    component="weight_publisher"
                ).inc()
                log.exception("could not re-sign the weights of %s", self.model)

    def announce(self, record: str) -> None:
        """Sign ``record`` (a serving record's JSON) into every envelope from now on, and
        publish the newest snapshot again with it at once (a move reaches replicas without
        waiting for the next version)."""
        with self._send_lock:
            self.serving_record = record
            last = self._last_sent
            if last is None or not self.connection.connected.is_set():
                return  # the next snapshot carries it
            self._send_locked(last)

    def held_topic(self, version: int) -> str:
        """Where version ``version``'s payload is retained while a label or the pin names it."""
        return f"{self.topic}/held/{version}"

    def publish_held(self, version: int, payload: bytes) -> None:
        """Retain ``payload`` (the weight format's bytes; the signed record binds its sha256)
        for replicas, late ones included."""
        self.connection.publish(self.held_topic(version), payload, qos=1, retain=True)

    def release_held(self, version: int) -> None:
        """Delete version ``version``'s retained payload (nothing names it any more)."""
        self.connection.publish(self.held_topic(version), b"", qos=1, retain=True)

    def _refresh_if_due(self) -> None:
        with self._send_lock:
            last = self._last_sent
            due = time.monotonic() - self._last_sent_at >= self.refresh_interval_s
            if last is None or not due or not self.connection.connected.is_set():
                return
            if self._send_locked(last) is None:
                return
        self.metrics.group(WeightsPublishedMetrics).weights_published.labels(
            model=self.model, kind="refresh"
        ).inc()
        log.debug("weights %s v%d re-signed and published again", self.model, last.version)

    def _seen(self, message: RawMessage) -> None:
        """A message on the weight topic (paho's thread): anything not this learner's own is
        reported and a restore is asked for."""
        foreign = self._foreign(message.payload)
        if foreign is None:
            return
        self.metrics.group(WeightsPublishedMetrics).weights_foreign.labels(model=self.model).inc()
        lines = self._retained_foreign_lines if message.retained else self._foreign_lines
        held = lines.allow()
        if held is not None:
            log.log(
                logging.WARNING if message.retained else logging.ERROR,
                "weights %s: %s on its own weight topic %s is not this learner's (key id %s, "
                "lineage %s): %s. Another learner of this model on the broker (same topic, other "
                "storage or key), or someone else publishing there; replicas would refuse or "
                "follow it. Putting this learner's snapshot back (livefit_weights_foreign_total)%s",
                self.model,
                "the retained message found at subscribe" if message.retained else "a message",
                self.topic, self.signer.key_id, self._own_lineage() or "not yet known", foreign,
                held,
            )  # fmt: skip
        with self._send_lock:
            self._restore_wanted = True
        self._wake.set()

    def _own_lineage(self) -> str | None:
        last = self._last_sent or (self._last_encoded[1] if self._last_encoded else None)
        return last.lineage if last is not None else None

    def _foreign(self, data: bytes) -> str | None:
        """Why ``data`` is not one of this learner's own envelopes (None: it is)."""
        if not data:
            return "the retained message was deleted (an empty message)"
        try:
            envelope = open_envelope(data)
        except WeightsRejected as exc:
            return f"not a weights envelope signed by anyone ({exc.detail})"
        header = envelope.header
        said = f"it says key id {header.key_id or 'none'}, lineage {header.lineage}, "
        said += f"v{header.version}"
        if header.key_id != self.signer.key_id or not self.signer.public.verify(
            envelope.signature, envelope.signed_bytes()
        ):
            return f"not signed by this learner's key ({said})"
        lineage = self._own_lineage()
        if header.topic != self.topic or (lineage is not None and header.lineage != lineage):
            return f"this learner's key, another lineage or topic ({said}, topic {header.topic})"
        return None

    def _restore_if_due(self) -> None:
        """Put the newest snapshot back after a foreign message (see the module docstring)."""
        with self._send_lock:
            last = self._last_sent
            if not self._restore_wanted or last is None:
                return  # nothing published yet: the first snapshot will replace it
            now = time.monotonic()
            if now < self._restored_at + self._restore_gap_s:
                return
            if not self.connection.connected.is_set():
                return
            self._restore_wanted = False
            # The same fight while foreign messages come within a minute after the gap ran out
            # (comparing with a minute alone restarted the gap at 0 each time it reached 60 s).
            recent = now - self._restored_at < self._restore_gap_s + RESTORE_GAP_MAX_S
            self._restore_gap_s = (
                min(max(RESTORE_GAP_MIN_S, self._restore_gap_s * 2), RESTORE_GAP_MAX_S)
                if recent
                else 0.0
            )
            self._restored_at = now
            if self._send_locked(last) is None:
                return
        self.metrics.group(WeightsPublishedMetrics).weights_published.labels(
            model=self.model, kind="restore"
        ).inc()
        held = self._restore_lines.allow()
        if held is not None:
            log.warning(
                "weights %s v%d (lineage %s) put back on %s as the retained message (next time "
                "in %.0f s at the soonest)%s",
                self.model, last.version, last.lineage, self.topic, self._restore_gap_s, held,
            )  # fmt: skip

    def _record(
        self, snapshot: Snapshot, encoded: EncodedWeights, kind: str, seconds: float
    ) -> None:
        m = self.metrics.group(WeightsPublishedMetrics)
        self.published_version = snapshot.version
        m.weights_published.labels(model=self.model, kind=kind).inc()
        m.weights_publish_seconds.labels(model=self.model).observe(seconds)
        m.weights_payload_bytes.labels(model=self.model).set(len(encoded.payload))
        m.published_version.labels(model=self.model).set(snapshot.version)
        if snapshot.newest_published_at is not None:
            freshness = max(0.0, time.time() - snapshot.newest_published_at)
            published = self.metrics.group(FreshnessMetrics).freshness.labels(
                model=self.model, stage="published"
            )
            published.observe(freshness)
        size, ms = len(encoded.payload), seconds * 1000
        self._versions.record(
            snapshot.version,
            f"weights {self.model} v{snapshot.version} published "
            f"({kind}, {size} bytes, {ms:.1f} ms)",
            f"; the last {kind}, {size} bytes, {ms:.1f} ms",
        )
