"""The ingest worker: one model's raw MQTT messages -> decoded, validated samples in its queue.

Each model has its own MQTT session and its own worker (``runtime.py``), so a model whose
trainer cannot keep up holds back only its own stream. The worker runs off paho's network
thread. For each message, in arrival order: decode and validate, then accept it or reject it.

Every message ends acknowledged, whatever it contains: accepted, or rejected with a reason
(counted, reported on the model's dead-letter topic, logged with back-off). An exception
nobody foresaw is a rejection with reason ``internal``, never a message left unacknowledged in
the receive window (which the broker would redeliver after every restart).

Accepted messages are written to the write-ahead log as one group with one fsync; only then are
their sequence numbers held, the messages acknowledged in arrival order and their samples put
on the queue (waiting while it is full, which stops the acks and so makes the broker hold the
rest). A group the log cannot store (full or failing disk) stays in hand, unacknowledged, and
is retried with back-off while readiness reports the failure. Messages on the model's labels
and predictions topics take the same way as events for its ``LabelJoiner`` (``labels``): logged
in the same group, acknowledged once durable, then joined; the samples a join makes are queued
like any others. Without a WAL
(``storage.wal = false``) messages are acknowledged once queued, and a crash can lose what was
queued but not yet trained.
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

from livefit.server.ingestion.dedup import SequenceTracker
from livefit.server.ingestion.samples import QueueClosed, SampleQueue
from livefit.server.ingestion.wal import StorageError, WriteAheadLog
from livefit.server.labels.joiner import LabelEvent, LabelJoiner
from livefit.server.messaging.codec import DecodedMessage, Rejection, SampleSpec, decode_message
from livefit.server.messaging.mqtt import MqttConnection, RawMessage
from livefit.server.metrics import Metrics
from livefit.server.storage.storage_health import LogLimiter, StorageHealth

log = logging.getLogger(__name__)
DEAD_LETTER_PAYLOAD_LIMIT = 4096  # bytes of the original payload echoed in the report
LOGGED_PAYLOAD_BYTES = 64  # bytes of a rejected payload shown in the log line
_POLL_S = 0.1
_RETRY_MIN_S, _RETRY_MAX_S = 0.05, 5.0


@dataclass(frozen=True, slots=True)
class Route:
    """Where one model's samples go: its subscription, shapes, queue and dead-letter topic.

    ``sequences`` follows (source, seq) numbers: it drops duplicates when ``drop_duplicates``
    (the model's ``dedup`` setting) and otherwise only counts what is missing."""

    model: str
    subscription: str
    spec: SampleSpec
    queue: SampleQueue
    dead_letter_topic: str
    sequences: SequenceTracker | None = None
    drop_duplicates: bool = False
    labels: LabelJoiner | None = None  # its delayed labels (labels and predictions topics)


@dataclass(slots=True)
class _Held:
    """A handled message waiting for the group commit: ack it, then queue its samples (or
    apply its label event). A tick has no message: it is logged and applied, never acked."""

    message: RawMessage | None
    decoded: DecodedMessage | None = None  # None: rejected, duplicate or unrouted (ack only)
    event: LabelEvent | None = None
    position: int | None = None  # the event's log position, once durable

    @property
    def logged(self) -> bool:
        return self.decoded is not None or self.event is not None


class IngestWorker:
    """Drains one MQTT connection's inbox into its model's queue."""

    def __init__(
        self,
        connection: MqttConnection,
        route: Route,
        metrics: Metrics,
        wal: WriteAheadLog | None = None,
        group_max: int = 1000,
        commit_window_s: float = 0.0,
        storage: StorageHealth | None = None,
        stall_after_s: float = 30.0,
    ) -> None:
        self.connection = connection
        self.route = route
        self.metrics = metrics
        self.wal = wal
        self.group_max = group_max
        self.commit_window_s = commit_window_s
        self.storage = storage or StorageHealth(metrics)
        self.stall_after_s = stall_after_s
        self._held: list[_Held] = []
        self._in_hand: RawMessage | None = None
        self._group_started = 0.0  # when the first message of the held group was taken
        self._last_finished_at = time.time()  # when a message was last acknowledged
        self._log_limiter = LogLimiter()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"ingest-{self.route.model}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the group in hand; unacknowledged messages are redelivered by the broker."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # health ------------------------------------------------------------------------------------
    def stalled(self) -> bool:
        """True when a message has waited more than ``stall_after_s`` and none was finished
        (accepted or rejected) in that time: the model is not learning from its stream."""
        oldest = self._oldest_waiting()
        if oldest is None:
            return False
        now = time.time()
        limit = self.stall_after_s
        return now - oldest > limit and now - self._last_finished_at > limit

    def _oldest_waiting(self) -> float | None:
        held, in_hand = self._held, self._in_hand
        first = next((item.message for item in held if item.message is not None), None)
        if first is not None:
            return first.received_at
        if in_hand is not None:
            return in_hand.received_at
        try:
            return self.connection.inbox.queue[0].received_at  # peek; racy reads are fine
        except IndexError:
            return None

    # the loop ----------------------------------------------------------------------------------
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
                self._tick()
                if self._held:
                    self._flush_safely()
                continue
            if not self._held:
                self._group_started = time.monotonic()
            self._take(message)
            self._tick()
            if len(self._held) >= self.group_max:
                self._flush_safely()
        self._flush_safely()

    def _take(self, message: RawMessage) -> None:
        """Handle one message; whatever goes wrong, it ends held (so it will be acknowledged)."""
        self._in_hand = message
        try:
            self.handle(message)
        except Exception as exc:  # a bug or a case nobody foresaw: reject, never get stuck
            self._held.append(_Held(message))
            self.metrics.internal_errors.labels(component="ingest").inc()
            try:
                self._reject(message, Rejection("internal", f"{type(exc).__name__}: {exc}"[:300]))
            except Exception:
                log.exception("could not report a rejected message on %s", message.topic)
        finally:
            self._in_hand = None

    def _tick(self) -> None:
        """Hold an expiry tick for the delayed labels when one is due."""
        labels = self.route.labels
        if labels is None:
            return
        try:
            event = labels.tick_due()
        except Exception:
            self.metrics.internal_errors.labels(component="labels").inc()
            log.exception("delayed-label expiry check failed for %s", self.route.model)
            return
        if event is not None:
            if not self._held:
                self._group_started = time.monotonic()
            self._held.append(_Held(None, event=event))

    def _flush_safely(self) -> None:
        try:
            self.flush()
        except Exception:
            self.metrics.internal_errors.labels(component="ingest").inc()
            log.exception("ingest failed to finish a group of %d messages", len(self._held))

    def route_for(self, topic: str) -> Route | None:
        route = self.route
        if route.labels is not None and route.labels.owns(topic):
            return route
        return route if topic_matches_sub(route.subscription, topic) else None

    def handle(self, message: RawMessage) -> None:
        """Decode and validate one message; hold it for the next ``flush``."""
        route = self.route_for(message.topic)
        if route is None:
            log.warning("message on %s matches no model; acknowledged and dropped", message.topic)
            self._held.append(_Held(message))
            return
        if route.labels is not None and route.labels.owns(message.topic):
            try:
                event = route.labels.decode(message)
            except Rejection as rejection:
                self._reject(message, rejection)
                self._held.append(_Held(message))
                return
            self._held.append(_Held(message, event=event))
            return
        try:
            decoded = decode_message(message.payload, route.spec, message.content_type)
        except Rejection as rejection:
            self._reject(message, rejection)
            self._held.append(_Held(message))
            return
        if self._is_duplicate(decoded):
            self._held.append(_Held(message))
            return
        self._held.append(_Held(message, decoded))

    def _is_duplicate(self, decoded: DecodedMessage) -> bool:
        route = self.route
        if route.sequences is None or decoded.source is None or decoded.seq is None:
            return False
        duplicate = route.sequences.check(decoded.source, decoded.seq)
        if duplicate and route.drop_duplicates:
            self.metrics.ingest_duplicates.labels(model=route.model).inc()
            return True
        return False

    # committing --------------------------------------------------------------------------------
    def flush(self) -> None:
        """Log the held group durably, then ack each message and queue its samples."""
        if not self._held:
            return
        held = self._held
        if self.wal is not None and not self._log(held):
            self._held = []
            self._forget_pending()  # stopping with the group not durable: the broker has it
            return
        self._held = []
        if self.wal is not None:  # durable now: remember sequence numbers, ack in order
            self._commit_sequences()
            for item in held:
                self._ack(item.message)
        for index, item in enumerate(held):
            if not self._deliver(item):
                # Stopping: the rest are in the log (replayed at start) or with the broker.
                log.info("ingest stopped with %d messages not queued", len(held) - index)
                self._forget_pending()
                return
            if self.wal is None:
                self._ack(item.message)
        if self.wal is None:
            self._commit_sequences()

    def _log(self, held: list[_Held]) -> bool:
        """Write the accepted messages of ``held`` to the log, retrying with back-off while
        storage fails; set their positions. False if stopped before they were durable."""
        accepted = [item for item in held if item.logged]
        if not accepted:
            return True
        assert self.wal is not None
        records = [self._record(item) for item in accepted]
        delay = _RETRY_MIN_S
        while True:
            started = time.perf_counter()
            try:
                positions = self.wal.write_group(records)
            except StorageError as exc:
                self.storage.failed(exc.op, exc.cause)
            else:
                self.metrics.wal_commit_seconds.observe(time.perf_counter() - started)
                self.storage.recovered("wal_open")
                self.storage.recovered("wal_write")
                self.storage.recovered("wal_fsync")
                break
            if self._stopping.wait(delay):
                return False
            delay = min(delay * 2, _RETRY_MAX_S)
        for item, position in zip(accepted, positions, strict=True):
            item.position = position
            if item.decoded is not None:
                chunk = replace(item.decoded.chunk, position=position)
                item.decoded = replace(item.decoded, chunk=chunk)
        return True

    def _record(self, item: _Held) -> tuple[str, bytes, str | None]:
        """The log record of a held sample message or label event."""
        if item.event is not None:
            assert self.route.labels is not None
            return (self.route.model, *self.route.labels.wal_record(item.event))
        assert item.message is not None
        return self.route.model, item.message.payload, item.message.content_type

    def _deliver(self, item: _Held) -> bool:
        """Queue a held message's samples, or apply its label event and queue what it made.
        False when stopping first."""
        if item.decoded is not None:
            return self._enqueue(item.decoded)
        if item.event is None or self.route.labels is None:
            return True
        try:
            chunk = self.route.labels.apply(item.event, item.position)
        except Exception:  # a bug: the event is logged (replayed at start); the stream goes on
            self.metrics.internal_errors.labels(component="labels").inc()
            log.exception("applying a delayed-label event of %s failed", self.route.model)
            return True
        if chunk is None:
            return True
        return self._enqueue(DecodedMessage(chunk), counted=False)

    def _ack(self, message: RawMessage | None) -> None:
        if message is None:
            return
        self.connection.ack(message)
        self._last_finished_at = time.time()

    def _commit_sequences(self) -> None:
        tracker = self.route.sequences
        if tracker is None:
            return
        gaps = tracker.commit()
        model = self.route.model
        if gaps:
            self.metrics.ingest_seq_gaps.labels(model=model).inc(gaps)
        self.metrics.ingest_seq_missing.labels(model=model).set(tracker.missing)

    def _forget_pending(self) -> None:
        if self.route.sequences is not None:
            self.route.sequences.discard_pending()

    def _enqueue(self, decoded: DecodedMessage, counted: bool = True) -> bool:
        """Put the samples on the model's queue, waiting while it is full (backpressure);
        ``counted``: count it as an accepted sample message."""
        route = self.route
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
        if counted:
            m.ingest_messages.labels(model=route.model, outcome="accepted", reason="none").inc()
        m.ingest_samples.labels(model=route.model).inc(n)
        m.queue_depth.labels(model=route.model).set(len(route.queue))
        return True

    # rejecting ---------------------------------------------------------------------------------
    def _reject(self, message: RawMessage, rejection: Rejection) -> None:
        route = self.route
        self.metrics.ingest_messages.labels(
            model=route.model, outcome="rejected", reason=rejection.reason
        ).inc()
        held_back = self._log_limiter.allow(rejection.reason)
        if held_back is not None:
            log.log(
                logging.WARNING if rejection.reason == "internal" else logging.INFO,
                "rejected a message on %s for %s: %s; payload starts %r%s",
                message.topic, route.model, rejection,
                message.payload[:LOGGED_PAYLOAD_BYTES],
                f" ({held_back} more like it not logged)" if held_back else "",
            )  # fmt: skip
        report = dead_letter_report(route.model, message, rejection)
        try:
            self.connection.publish(
                route.dead_letter_topic, report, qos=1, content_type="application/json"
            )
            self.metrics.dead_letters.labels(model=route.model, outcome="sent").inc()
        except Exception as exc:
            self.metrics.dead_letters.labels(model=route.model, outcome="failed").inc()
            if self._log_limiter.allow("dead-letter-failed") is not None:
                log.error("could not publish to dead-letter topic %s: %s",
                          route.dead_letter_topic, exc)  # fmt: skip


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
