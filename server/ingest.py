"""The ingest worker: raw MQTT messages -> decoded, validated samples in each model's queue.

It runs off paho's network thread. For each message, in arrival order: find the model by topic,
decode and validate, then either accept it or reject it (counted, reported on the model's
dead-letter topic). Accepted messages are appended to the write-ahead log; a group of messages
is committed with one fsync, and only then are they acknowledged to the broker, in arrival
order, and their samples put on the model's queue (waiting while it is full, which stops the
acks and so makes the broker hold the rest). A message is never acknowledged before livefit
holds its samples durably; without a WAL (``storage.wal = false``) they are acknowledged once
they are in the queue, and a crash can lose what was queued but not yet trained.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, replace

from paho.mqtt.client import topic_matches_sub

from livefit.server.codec import DecodedMessage, Rejection, SampleSpec, decode_message
from livefit.server.dedup import SequenceTracker
from livefit.server.metrics import Metrics
from livefit.server.mqtt import MqttConnection, RawMessage
from livefit.server.samples import QueueClosed, SampleQueue
from livefit.server.wal import WriteAheadLog

log = logging.getLogger(__name__)
DEAD_LETTER_PAYLOAD_LIMIT = 4096  # bytes of the original payload echoed in the report
_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Route:
    """Where one model's samples go: its subscription, shapes, queue and dead-letter topic."""

    model: str
    subscription: str
    spec: SampleSpec
    queue: SampleQueue
    dead_letter_topic: str
    dedup: SequenceTracker | None = None


@dataclass(slots=True)
class _Held:
    """A handled message waiting for the group commit: ack it, then queue its samples."""

    message: RawMessage
    route: Route | None = None
    decoded: DecodedMessage | None = None


class IngestWorker:
    """Drains the MQTT inbox into model queues; counts and reports what it rejects."""

    def __init__(
        self,
        connection: MqttConnection,
        routes: list[Route],
        metrics: Metrics,
        wal: WriteAheadLog | None = None,
        group_max: int = 1000,
        commit_window_s: float = 0.0,
    ) -> None:
        self.connection = connection
        self.routes = routes
        self.metrics = metrics
        self.wal = wal
        self.group_max = group_max
        self.commit_window_s = commit_window_s
        self._held: list[_Held] = []
        self._group_started = 0.0  # when the first message of the held group was taken
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the group in hand; unacknowledged messages are redelivered by the broker."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        """Group messages: commit when ``group_max`` are held, or when the inbox has stayed
        empty until ``commit_window_s`` after the group's first message (at once with 0)."""
        inbox = self.connection.inbox
        while not self._stopping.is_set():
            wait = _POLL_S
            if self._held:
                wait = self._group_started + self.commit_window_s - time.monotonic()
            try:
                message = inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait()
            except queue.Empty:
                if self._held:
                    self._flush_safely()
                continue
            try:
                if not self._held:
                    self._group_started = time.monotonic()
                self.handle(message)
                if len(self._held) >= self.group_max:
                    self.flush()
            except Exception:
                self.metrics.internal_errors.labels(component="ingest").inc()
                log.exception("ingest failed on a message from %s; continuing", message.topic)
        self.flush()

    def _flush_safely(self) -> None:
        try:
            self.flush()
        except Exception:
            self.metrics.internal_errors.labels(component="ingest").inc()
            log.exception("ingest failed to commit a group of %d messages", len(self._held))

    def route_for(self, topic: str) -> Route | None:
        for route in self.routes:
            if topic_matches_sub(route.subscription, topic):
                return route
        return None

    def handle(self, message: RawMessage) -> None:
        """Decode and validate one message; hold it for the next ``flush``."""
        route = self.route_for(message.topic)
        if route is None:
            log.warning("message on %s matches no model; acknowledged and dropped", message.topic)
            self._held.append(_Held(message))
            return
        try:
            decoded = decode_message(message.payload, route.spec, message.content_type)
        except Rejection as rejection:
            self._reject(route, message, rejection)
            self._held.append(_Held(message))
            return
        if self._is_duplicate(route, decoded):
            self._held.append(_Held(message))
            return
        if self.wal is not None:
            position = self.wal.append(route.model, message.payload, message.content_type)
            decoded = replace(decoded, chunk=replace(decoded.chunk, position=position))
        self._held.append(_Held(message, route, decoded))

    def _is_duplicate(self, route: Route, decoded: DecodedMessage) -> bool:
        if route.dedup is None or decoded.source is None or decoded.seq is None:
            return False
        duplicate = route.dedup.check(decoded.source, decoded.seq)
        if duplicate:
            self.metrics.ingest_duplicates.labels(model=route.model).inc()
        return duplicate

    def flush(self) -> None:
        """Commit the held group to the log, then ack each message and queue its samples."""
        if not self._held:
            return
        if self.wal is not None:
            started = time.perf_counter()
            self.wal.commit()
            self.metrics.wal_commit_seconds.observe(time.perf_counter() - started)
        held, self._held = self._held, []
        trackers = {id(r.dedup): r.dedup for r in (i.route for i in held) if r and r.dedup}
        if self.wal is not None:  # durable now: remember sequence numbers, ack in order
            for route_tracker in trackers.values():
                self._commit(route_tracker, held)
            for item in held:
                self.connection.ack(item.message)
        for index, item in enumerate(held):
            if item.route is not None and item.decoded is not None:
                queued = self._enqueue(item.route, item.decoded)
                if not queued:  # stopping: the rest are in the log (replayed) or with the broker
                    log.info("ingest stopped with %d messages not queued", len(held) - index)
                    for tracker in trackers.values():
                        tracker.discard_pending()
                    return
            if self.wal is None:
                self.connection.ack(item.message)
        if self.wal is None:
            for tracker in trackers.values():
                self._commit(tracker, held)

    def _commit(self, tracker: SequenceTracker, held: list[_Held]) -> None:
        gaps = tracker.commit()
        if gaps:
            model = next(i.route.model for i in held if i.route and i.route.dedup is tracker)
            self.metrics.ingest_seq_gaps.labels(model=model).inc(gaps)

    def _enqueue(self, route: Route, decoded: DecodedMessage) -> bool:
        """Put the samples on the model's queue, waiting while it is full (backpressure)."""
        while not self._stopping.is_set():
            try:
                if route.queue.put(decoded.chunk, timeout=_POLL_S):
                    break
            except QueueClosed:
                return False
        else:
            return False
        n = len(decoded.chunk)
        m = self.metrics
        m.ingest_messages.labels(model=route.model, outcome="accepted", reason="none").inc()
        m.ingest_samples.labels(model=route.model).inc(n)
        m.queue_depth.labels(model=route.model).set(len(route.queue))
        return True

    def _reject(self, route: Route, message: RawMessage, rejection: Rejection) -> None:
        self.metrics.ingest_messages.labels(
            model=route.model, outcome="rejected", reason=rejection.reason
        ).inc()
        log.info("rejected a message on %s for %s: %s", message.topic, route.model, rejection)
        report = dead_letter_report(route.model, message, rejection)
        try:
            self.connection.publish(
                route.dead_letter_topic, report, qos=1, content_type="application/json"
            )
            self.metrics.dead_letters.labels(model=route.model, outcome="sent").inc()
        except Exception:
            self.metrics.dead_letters.labels(model=route.model, outcome="failed").inc()
            log.exception("could not publish to dead-letter topic %s", route.dead_letter_topic)


def dead_letter_report(model: str, message: RawMessage, rejection: Rejection) -> bytes:
    """The JSON report published for a rejected message (original payload base64, truncated)."""
    echoed = message.payload[:DEAD_LETTER_PAYLOAD_LIMIT]
    return json.dumps(
        {
            "model": model,
            "topic": message.topic,
            "reason": rejection.reason,
            "detail": rejection.detail,
            "received_at": message.received_at,
            "reported_at": time.time(),
            "payload_bytes": len(message.payload),
            "payload_base64": base64.b64encode(echoed).decode("ascii"),
            "payload_truncated": len(message.payload) > DEAD_LETTER_PAYLOAD_LIMIT,
        }
    ).encode()
