"""The ingest worker: raw MQTT messages -> decoded, validated samples in each model's queue.

It runs off paho's network thread. For each message, in arrival order: find the model by topic,
decode and validate, then either put the samples on the model's queue (waiting while it is
full) or report the rejection on the model's dead-letter topic; only then acknowledge the
message to the broker. Acks therefore go out in the order messages came in, and a message is
never acknowledged before livefit holds its samples.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass

from paho.mqtt.client import topic_matches_sub

from livefit.server.codec import DecodedMessage, Rejection, SampleSpec, decode_message
from livefit.server.metrics import Metrics
from livefit.server.mqtt import MqttConnection, RawMessage
from livefit.server.samples import QueueClosed, SampleQueue

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


class IngestWorker:
    """Drains the MQTT inbox into model queues; counts and reports what it rejects."""

    def __init__(self, connection: MqttConnection, routes: list[Route], metrics: Metrics) -> None:
        self.connection = connection
        self.routes = routes
        self.metrics = metrics
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the message in hand; unacknowledged ones are redelivered by the broker."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        inbox = self.connection.inbox
        while not self._stopping.is_set():
            try:
                message = inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                self.handle(message)
            except Exception:
                self.metrics.internal_errors.labels(component="ingest").inc()
                log.exception("ingest failed on a message from %s; continuing", message.topic)

    def route_for(self, topic: str) -> Route | None:
        for route in self.routes:
            if topic_matches_sub(route.subscription, topic):
                return route
        return None

    def handle(self, message: RawMessage) -> None:
        """Decode, validate and queue (or reject) one message, then acknowledge it."""
        route = self.route_for(message.topic)
        if route is None:
            log.warning("message on %s matches no model; acknowledged and dropped", message.topic)
            self.connection.ack(message)
            return
        try:
            decoded = decode_message(message.payload, route.spec, message.content_type)
        except Rejection as rejection:
            self._reject(route, message, rejection)
            return
        if self._enqueue(route, decoded):
            self.connection.ack(message)

    def _enqueue(self, route: Route, decoded: DecodedMessage) -> bool:
        """Put the samples on the model's queue, waiting while it is full (backpressure)."""
        while not self._stopping.is_set():
            try:
                if route.queue.put(decoded.chunk, timeout=_POLL_S):
                    break
            except QueueClosed:
                return False
        else:
            return False  # stopping: leave it unacknowledged, the broker will redeliver it
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
        self.connection.ack(message)


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
