"""One model's group commit: held messages -> write-ahead log -> acks -> queue.

``GroupCommit`` holds the group of messages an ``IngestWorker`` has handled (``Held``) and
finishes it: it writes the accepted ones to the log as one group with one fsync (retried with
back-off while storage fails), and only then holds their sequence numbers, acknowledges them in
arrival order and queues their samples (waiting while the queue is full: backpressure). Without
a log, each message is acknowledged once queued. The worker owns one and decides when to flush.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

from ..base.metrics import ErrorMetrics, Metrics
from ..labels.joiner import LabelEvent
from ..mqtt.connection import MqttConnection, RawMessage
from ..storage.health import StorageHealth
from ..storage.metrics import WalMetrics
from ..storage.wal import StorageError, WriteAheadLog
from ..wire.codec import DecodedMessage
from .metrics import IngestMetrics, IngestSequenceMetrics, SampleQueueMetrics
from .route import Route
from .sample_queue import QueueClosed

log = logging.getLogger(__name__)
POLL_S = 0.1
_RETRY_MIN_S, _RETRY_MAX_S = 0.05, 5.0
# On stop, a group already logged and acknowledged is still queued while the trainer drains the
# queue (it stops after ingestion), for at most this long: "train what was accepted" covers the
# messages backpressure held, not only those queued (an outside attack found 28,000 acknowledged
# samples left to the next start's replay after a SIGTERM). Past it (a trainer that does not
# drain), the rest are in the log and replayed at the next start. Below the worker's join (10 s).
STOP_DELIVERY_S = 8.0


@dataclass(slots=True)
class Held:
    """A handled message waiting for the group commit: ack it, then queue its samples (or
    apply its label event). A tick has no message: it is logged and applied, never acked."""

    message: RawMessage | None
    decoded: DecodedMessage | None = None  # None: rejected, duplicate or unrouted (ack only)
    event: LabelEvent | None = None
    position: int | None = None  # the event's log position, once durable

    @property
    def logged(self) -> bool:
        return self.decoded is not None or self.event is not None


class GroupCommit:
    """The group of handled messages one ``IngestWorker`` holds, and its commit.

    ``held`` is the group (its first message is the oldest waiting); ``flush`` commits it and
    starts a new one. A group the log could not store before ``stopping`` was set is dropped
    (the broker redelivers it); one whose write raised anything but a storage error stays
    held, and is tried again at the next flush.
    """

    def __init__(
        self,
        connection: MqttConnection,
        route: Route,
        metrics: Metrics,
        wal: WriteAheadLog | None,
        storage: StorageHealth,
        stopping: threading.Event,
    ) -> None:
        self.connection = connection
        self.route = route
        self.metrics = metrics
        self.wal = wal
        self.storage = storage
        self.held: list[Held] = []
        self.last_acked_at = time.monotonic()  # when a message was last acknowledged
        self._stopping = stopping
        self._delivery_deadline: float | None = None  # set once stopping: see STOP_DELIVERY_S

    def hold(self, item: Held) -> None:
        """Add a handled message (or a tick) to the group; it ends at the next ``flush``."""
        self.held.append(item)

    def flush(self) -> None:
        """Log the held group durably, then ack each message and queue its samples."""
        if not self.held:
            return
        held = self.held
        if self.wal is not None and not self._log(held):
            self.held = []
            self._forget_pending()  # stopping with the group not durable: the broker has it
            return
        self.held = []
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

    def _log(self, held: list[Held]) -> bool:
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
                self.metrics.group(WalMetrics).wal_commit_seconds.observe(
                    time.perf_counter() - started
                )
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

    def _record(self, item: Held) -> tuple[str, bytes, str | None]:
        """The log record of a held sample message or label event."""
        if item.event is not None:
            assert self.route.labels is not None
            return (self.route.model, *self.route.labels.wal_record(item.event))
        assert item.message is not None
        return self.route.model, item.message.payload, item.message.content_type

    def _deliver(self, item: Held) -> bool:
        """Queue a held message's samples, or apply its label event and queue what it made.
        False when stopping first."""
        if item.decoded is not None:
            return self._enqueue(item.decoded)
        if item.event is None or self.route.labels is None:
            return True
        try:
            chunk = self.route.labels.apply(item.event, item.position)
        except Exception:  # a bug: the event is logged (replayed at start); the stream goes on
            self.metrics.group(ErrorMetrics).internal_errors.labels(component="labels").inc()
            log.exception("applying a delayed-label event of %s failed", self.route.model)
            return True
        if chunk is None:
            return True
        return self._enqueue(DecodedMessage(chunk), counted=False)

    def _ack(self, message: RawMessage | None) -> None:
        if message is None:
            return
        self.connection.ack(message)
        self.last_acked_at = time.monotonic()

    def _commit_sequences(self) -> None:
        tracker = self.route.sequences
        if tracker is None:
            return
        gaps = tracker.commit()
        model = self.route.model
        if gaps:
            self.metrics.group(IngestSequenceMetrics).ingest_seq_gaps.labels(model=model).inc(gaps)
        self.metrics.group(IngestSequenceMetrics).ingest_seq_missing.labels(model=model).set(
            tracker.missing
        )

    def _forget_pending(self) -> None:
        if self.route.sequences is not None:
            self.route.sequences.discard_pending()

    def _stop_delivery_deadline(self) -> float:
        """Until when a stopping worker still queues what it acknowledged (one deadline for
        all its held messages, from the first time it is asked)."""
        if self._delivery_deadline is None:
            self._delivery_deadline = time.monotonic() + STOP_DELIVERY_S
        return self._delivery_deadline

    def _enqueue(self, decoded: DecodedMessage, counted: bool = True) -> bool:
        """Put the samples on the model's queue, waiting while it is full (backpressure), also
        while stopping (at most ``STOP_DELIVERY_S``, the queue still open); ``counted``: count
        it as an accepted sample message. False when the samples were not queued."""
        route = self.route
        while True:
            if self._stopping.is_set() and time.monotonic() > self._stop_delivery_deadline():
                return False
            try:
                if route.queue.put(decoded.chunk, timeout=POLL_S):
                    break
            except QueueClosed:
                return False
        n = len(decoded.chunk)
        m = self.metrics.group(IngestMetrics)
        if counted:
            m.ingest_messages.labels(model=route.model, outcome="accepted", reason="none").inc()
        m.ingest_samples.labels(model=route.model).inc(n)
        self.metrics.group(SampleQueueMetrics).queue_depth.labels(model=route.model).set(
            len(route.queue)
        )
        return True
