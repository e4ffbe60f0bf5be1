"""The ingest worker: one model's raw MQTT messages -> decoded, validated samples in its queue.

Each model has its own MQTT session and its own worker (``runtime.learner_models``), so a model
whose trainer cannot keep up holds back only its own stream. The worker runs off paho's network
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
queued but not yet trained. The worker decides what a message is and when a group ends; the
group it holds and the commit are its ``GroupCommit``'s (``group_commit``); where a model's
messages go is its ``route``.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import time

from paho.mqtt.client import topic_matches_sub

from ..base.metrics import ErrorMetrics, Metrics
from ..mqtt.connection import MqttConnection, RawMessage
from ..storage.health import LogLimiter, StorageHealth
from ..storage.metrics import StorageMetrics, WalMetrics
from ..storage.wal import WriteAheadLog
from ..wire.codec import DecodedMessage, decode_message
from ..wire.rejection import Rejection
from .group_commit import POLL_S, GroupCommit, Held
from .metrics import IngestMetrics, IngestSequenceMetrics, SampleQueueMetrics
from .route import Route

log = logging.getLogger(__name__)
DEAD_LETTER_PAYLOAD_LIMIT = 4096  # bytes of the original payload echoed in the report
LOGGED_PAYLOAD_BYTES = 64  # bytes of a rejected payload shown in the log line


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
        silent_topic_warn_s: float = 0.0,
    ) -> None:
        self.connection = connection
        self.route = route
        self.metrics = metrics
        metrics.group(IngestMetrics)
        metrics.group(IngestSequenceMetrics)
        metrics.group(StorageMetrics)
        metrics.group(SampleQueueMetrics)
        metrics.group(WalMetrics)
        metrics.group(ErrorMetrics)
        self.group_max = group_max
        self.commit_window_s = commit_window_s
        self.stall_after_s = stall_after_s
        self.silent_topic_warn_s = silent_topic_warn_s
        self._last_sample_at: float | None = None  # monotonic; a message on the samples topic
        self._silence_warned = False
        self._in_hand: RawMessage | None = None
        self._group_started = 0.0  # when the first message of the held group was taken
        self._log_limiter = LogLimiter()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.commit = GroupCommit(
            connection, route, metrics, wal, storage or StorageHealth(metrics), self._stopping
        )

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"ingest-{self.route.model}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the group in hand (queued while the trainer drains, for at most
        ``STOP_DELIVERY_S``); unacknowledged messages are redelivered by the broker."""
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
        return now - oldest > limit and now - self.commit.last_acked_at > limit

    def seconds_since_message(self) -> float:
        """Seconds since a message last arrived on the samples topic; since the first
        subscription when none has; 0 before it."""
        since = self._last_sample_at or self.connection.subscribed_at
        return 0.0 if since is None else time.monotonic() - since

    def _warn_if_silent(self) -> None:
        """Once: nothing arrived on the samples topic ``silent_topic_warn_s`` after the learner
        subscribed. mosquitto grants a subscription its ACL forbids and then delivers nothing
        (MQTT 3.1.1 and 5 alike), so a learner that may not read its topic is otherwise ready,
        connected and silent."""
        if self._silence_warned or self._last_sample_at is not None:
            return
        since = self.connection.subscribed_at
        limit = self.silent_topic_warn_s
        if limit <= 0 or since is None or time.monotonic() - since < limit:
            return
        self._silence_warned = True
        user = self.connection.address.username
        log.warning(
            "model %s: no message on %s in %.0f s since subscribing (as broker user %s). If "
            "publishers are sending, the broker's ACL probably forbids this user to read the "
            "topic: mosquitto grants such a subscription and delivers nothing. "
            "(models.%s.silent_topic_warn_s; 0 turns this warning off)",
            self.route.model, self.route.subscription, limit,
            repr(user) if user else "(anonymous)", self.route.model,
        )  # fmt: skip

    def _oldest_waiting(self) -> float | None:
        held, in_hand = self.commit.held, self._in_hand
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
            wait = POLL_S
            if self.commit.held:
                wait = self._group_started + self.commit_window_s - time.monotonic()
            try:
                message = inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait()
            except queue.Empty:
                self._tick()
                self._warn_if_silent()
                if self.commit.held:
                    self._flush_safely()
                continue
            if not self.commit.held:
                self._group_started = time.monotonic()
            self._take(message)
            self._tick()
            self._warn_if_silent()
            if len(self.commit.held) >= self.group_max:
                self._flush_safely()
        self._flush_safely()

    def _take(self, message: RawMessage) -> None:
        """Handle one message; whatever goes wrong, it ends held (so it will be acknowledged)."""
        self._in_hand = message
        try:
            self.handle(message)
        except Exception as exc:  # a bug or a case nobody foresaw: reject, never get stuck
            self.commit.hold(Held(message))
            self.metrics.group(ErrorMetrics).internal_errors.labels(component="ingest").inc()
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
            self.metrics.group(ErrorMetrics).internal_errors.labels(component="labels").inc()
            log.exception("delayed-label expiry check failed for %s", self.route.model)
            return
        if event is not None:
            if not self.commit.held:
                self._group_started = time.monotonic()
            self.commit.hold(Held(None, event=event))

    def _flush_safely(self) -> None:
        try:
            self.commit.flush()
        except Exception:
            self.metrics.group(ErrorMetrics).internal_errors.labels(component="ingest").inc()
            log.exception("ingest failed to finish a group of %d messages", len(self.commit.held))

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
            self.commit.hold(Held(message))
            return
        if route.labels is not None and route.labels.owns(message.topic):
            try:
                event = route.labels.decode(message)
            except Rejection as rejection:
                self._reject(message, rejection)
                self.commit.hold(Held(message))
                return
            self.commit.hold(Held(message, event=event))
            return
        self._last_sample_at = time.monotonic()
        try:
            decoded = decode_message(message.payload, route.spec, message.content_type)
        except Rejection as rejection:
            self._reject(message, rejection)
            self.commit.hold(Held(message))
            return
        if self._is_duplicate(decoded):
            self.commit.hold(Held(message))
            return
        self.commit.hold(Held(message, decoded))

    def _is_duplicate(self, decoded: DecodedMessage) -> bool:
        route = self.route
        if route.sequences is None or decoded.source is None or decoded.seq is None:
            return False
        duplicate = route.sequences.check(decoded.source, decoded.seq)
        if duplicate and route.drop_duplicates:
            self.metrics.group(IngestSequenceMetrics).ingest_duplicates.labels(
                model=route.model
            ).inc()
            return True
        return False

    # rejecting ---------------------------------------------------------------------------------
    def _reject(self, message: RawMessage, rejection: Rejection) -> None:
        route = self.route
        self.metrics.group(IngestMetrics).ingest_messages.labels(
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
            sent = self.connection.publish(
                route.dead_letter_topic, report, qos=1, content_type="application/json"
            )  # None: over the broker's maximum packet size (counted and logged there)
            outcome = "sent" if sent is not None else "failed"
            self.metrics.group(IngestMetrics).dead_letters.labels(
                model=route.model, outcome=outcome
            ).inc()
        except Exception as exc:
            self.metrics.group(IngestMetrics).dead_letters.labels(
                model=route.model, outcome="failed"
            ).inc()
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
