"""The serving side of delayed labels: prediction records to the learner, labels forwarded.

Every serving process (the learner's own API and each replica) has one ``PredictionRecorder``
per model. A prediction request with ids costs the request one append to a bounded buffer
(``labels.record_buffer_rows`` rows); a thread of the recorder sends what has gathered as one
msgpack message on ``livefit/<name>/predictions`` at QoS 1 through its own MQTT client, which
resends it after a reconnect. Nothing waits for the broker on the request's way: when the buffer
is full (the broker is away or slower than the predictions) rows are dropped and counted
(``livefit_prediction_records_total{outcome="dropped"}``), as are messages paho refuses to
queue (``max_queued_messages``) and messages over the broker's maximum packet size. Rows the
broker refuses (an ACL that does not let this process publish there: MQTT 5 PUBACK >= 0x80)
are counted as ``outcome="refused"`` and in ``livefit_broker_publish_refused_total``, and
logged. A dropped record means its label later waits as an early label
and expires as ``unknown_id``. Requests without ids record nothing; a row whose input or
output is not finite (which the HTTP handlers answer 422 and never record) is not sent either
(``outcome="non_finite"``): one such row must never cost the other rows of a message. The
MQTT client starts on the first record or label, so a process never asked for either opens no
connection. With a
cluster's nodes the client fails over between them (``mqtt.failover``), resending what the
lost node had not acknowledged.

``publish_label`` forwards a label message posted over HTTP to ``livefit/<name>/labels`` at
QoS 1 and waits for the broker's acknowledgement: once it returns, the broker holds the label
for the learner; a label the broker refuses raises ``PublishRefused`` (HTTP 502).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..base.metrics import Metrics
from ..config.broker_urls import BrokerAddress, as_nodes
from ..config.sections import BrokerSettings
from ..config.settings import Settings
from ..mqtt.failover import Failover
from ..mqtt.paho_client import paho_client
from ..mqtt.publish_guard import PublishGuard, publish_packet_bytes
from ..wire.label_ids import RowId
from ..wire.labels import PREDICTIONS_CONTENT_TYPE, encode_predictions
from .metrics import PredictionRecordMetrics

log = logging.getLogger(__name__)
MAX_MESSAGE_ROWS = 1024  # rows per prediction-record message at most
MAX_QUEUED_MESSAGES = 1000  # messages paho holds for the broker at most
_STOP_FLUSH_S = 2.0
_Record = tuple[list[RowId], np.ndarray, np.ndarray, int, float]  # ids, x, p, version, time


class NotPublished(Exception):
    """The broker did not acknowledge a label in time (or the client could not queue it)."""


class PublishRefused(NotPublished):
    """The broker refused the label (its ACL, a quota) or it is over the broker's packet limit:
    trying again will not help."""


class PredictionRecorder:
    """Sends one model's prediction records; forwards its labels posted over HTTP."""

    def __init__(
        self,
        model: str,
        topics: tuple[str, str],  # (predictions, labels)
        address: BrokerAddress | Sequence[BrokerAddress],
        broker: BrokerSettings,
        client_id: str,
        metrics: Metrics,
        max_rows: int = 10_000,
        protocol: str | None = None,
    ) -> None:
        self.model = model
        self.predictions_topic, self.labels_topic = topics
        self.broker, self.client_id = broker, client_id
        self.failover = Failover(as_nodes(address), broker, client_id, what=f"{client_id}: ")
        self.protocol = protocol or broker.protocol
        self.max_rows = max_rows
        self.source = client_id
        metrics.group(PredictionRecordMetrics)
        self._sent = metrics.group(PredictionRecordMetrics).prediction_records.labels(
            model=model, outcome="sent"
        )
        self._dropped = metrics.group(PredictionRecordMetrics).prediction_records.labels(
            model=model, outcome="dropped"
        )
        self._refused = metrics.group(PredictionRecordMetrics).prediction_records.labels(
            model=model, outcome="refused"
        )
        self._non_finite = metrics.group(PredictionRecordMetrics).prediction_records.labels(
            model=model, outcome="non_finite"
        )
        limit = broker.max_packet_size_bytes
        self.guard = PublishGuard(metrics, f"MQTT client {client_id!r}", limit)
        self._buffer: deque[_Record] = deque()
        self._rows = 0
        self._lock = threading.Condition()
        self._stopping = False
        self._client: paho.Client | None = None
        self._thread: threading.Thread | None = None
        self._last: paho.MQTTMessageInfo | None = None
        # Set by CONNACK: paho sends a QoS 1 message published between CONNECT and CONNACK of
        # connect_async at once and again when CONNACK flushes its queue (paho.mqtt.python
        # #910, #954), so a label is published only once the session is up.
        self._connected = threading.Event()

    @property
    def address(self) -> BrokerAddress:
        """The broker node this recorder is connected to, or tries next."""
        return self.failover.current

    def record(self, ids: list[RowId], x: np.ndarray, p: np.ndarray, version: int) -> None:
        """Buffer one answered request's rows (never blocks on the broker). A row with a
        non-finite input or output is never sent (the learner would refuse it): counted."""
        finite = _finite_rows(x, len(ids)) & _finite_rows(p, len(ids))
        if not finite.all():
            self._non_finite.inc(int((~finite).sum()))
            ids = [row_id for row_id, ok in zip(ids, finite, strict=True) if ok]
            x, p = x[finite], p[finite]
            if not ids:
                return
        n = len(ids)
        with self._lock:
            if self._stopping or self._rows + n > self.max_rows:
                self._dropped.inc(n)
                return
            # copies: the arrays may be views of the batch's buffers
            self._buffer.append((ids, np.array(x, np.float32), np.array(p, np.float32), version,
                                 time.time()))  # fmt: skip
            self._rows += n
            self._lock.notify()
        if self._thread is None:
            self._start()

    def publish_label(self, payload: bytes, content_type: str | None, timeout_s: float) -> None:
        """Publish a label message at QoS 1 and wait for the broker to take it."""
        client = self._start()
        if not self._connected.wait(timeout_s):
            raise NotPublished(
                f"not connected to the broker at {self.address} within {timeout_s:g} s"
            )
        properties = self._properties(content_type)
        mqtt5 = self.protocol == "5"
        if not self.guard.fits(self.labels_topic, payload, 1, properties, mqtt5):
            size = publish_packet_bytes(self.labels_topic, payload, 1, properties, mqtt5)
            self.guard.oversize(self.labels_topic, size)
            raise PublishRefused(
                f"the label message ({size} bytes as a PUBLISH) is over the broker's maximum "
                f"packet size of {self.guard.limit_bytes} bytes"
            )
        info = client.publish(self.labels_topic, payload, qos=1, properties=properties)
        ticket = self.guard.sent(info, self.labels_topic)
        try:
            info.wait_for_publish(timeout_s)
        except (ValueError, RuntimeError) as exc:
            raise NotPublished(f"the broker could not take the label now ({exc})") from None
        if ticket.refused is not None:
            raise PublishRefused(
                f"the broker refused the label on {self.labels_topic}: {ticket.refused} (its "
                "ACL must let this process's broker user publish there)"
            )
        if not info.is_published():
            raise NotPublished(f"the broker did not acknowledge the label within {timeout_s:g} s")

    def stop(self) -> None:
        """Send what is buffered (for up to 2 s while connected), then disconnect."""
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(_STOP_FLUSH_S + 1)
            self._thread = None
        client, self._client = self._client, None
        if client is None:
            return
        if self._last is not None and client.is_connected():
            with contextlib.suppress(ValueError, RuntimeError):
                self._last.wait_for_publish(_STOP_FLUSH_S)
        client.disconnect()
        client.loop_stop()

    # internals ---------------------------------------------------------------------------------
    def _start(self) -> paho.Client:
        with self._lock:
            if self._client is None:
                client = paho_client(
                    self.client_id, self.address, self.broker, protocol=self.protocol,
                    persistent=False,
                )  # fmt: skip
                client.max_queued_messages_set(MAX_QUEUED_MESSAGES)
                client.on_connect = self._on_connect
                client.on_publish = self.guard.on_publish
                client.on_disconnect = self._on_disconnect
                client.on_connect_fail = lambda c, _u: self.failover.failed(c, "nothing answered")
                client.on_pre_connect = lambda _c, _u: self.failover.attempt_started()
                self.failover.start(client, keepalive=self.broker.keepalive_s)
                client.loop_start()
                self._client = client
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(
                    target=self._run, name=f"predictions-{self.model}", daemon=True
                )
                self._thread.start()
            return self._client

    def _on_connect(self, client: paho.Client, userdata: object, *args: object) -> None:
        properties = args[-1] if args else None  # callback API 2: flags, reason, properties
        reason = args[1] if len(args) > 1 else None
        if getattr(reason, "is_failure", False):
            self.failover.failed(client, f"refused: {reason}")
            return
        self.failover.connected(client)
        self.guard.connected(properties)
        self._connected.set()

    def _on_disconnect(self, client: paho.Client, userdata: object, *args: object) -> None:
        self._connected.clear()
        reason = args[1] if len(args) > 1 else None  # callback API 2: flags, reason, properties
        if getattr(reason, "value", reason) != 0 and not self._stopping:
            self.failover.failed(client, f"connection lost: {reason}")

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._buffer and not self._stopping:
                    self._lock.wait(0.5)
                if not self._buffer and self._stopping:
                    return
                taken = self._take()
            try:
                self._send(taken)
            except Exception:  # never let the sender die: count, log, go on
                self._dropped.inc(sum(len(t[0]) for t in taken))
                log.exception("could not send prediction records of %s", self.model)

    def _take(self) -> list[_Record]:
        taken: list[_Record] = []
        rows = 0
        while self._buffer and (not taken or rows + len(self._buffer[0][0]) <= MAX_MESSAGE_ROWS):
            item = self._buffer.popleft()
            taken.append(item)
            rows += len(item[0])
        self._rows -= rows
        return taken

    def _send(self, taken: list[_Record]) -> None:
        ids = [row_id for item in taken for row_id in item[0]]
        version = [item[3] for item in taken for _ in item[0]]
        t = [item[4] for item in taken for _ in item[0]]
        x = np.concatenate([item[1] for item in taken])
        p = np.concatenate([item[2] for item in taken])
        payload = encode_predictions(ids, x, p, version, t, self.source)
        client = self._client
        if client is None:
            self._dropped.inc(len(ids))
            return
        properties = self._properties(PREDICTIONS_CONTENT_TYPE)
        mqtt5 = self.protocol == "5"
        if not self.guard.fits(self.predictions_topic, payload, 1, properties, mqtt5):
            size = publish_packet_bytes(self.predictions_topic, payload, 1, properties, mqtt5)
            self.guard.oversize(self.predictions_topic, size)
            self._dropped.inc(len(ids))
            return
        info = client.publish(self.predictions_topic, payload, qos=1, properties=properties)
        if info.rc == paho.MQTT_ERR_QUEUE_SIZE:
            self._dropped.inc(len(ids))
        else:  # sent, or queued by paho until the connection is back
            self._sent.inc(len(ids))
            self._last = info
            rows = len(ids)
            on_refused = lambda: self._refused.inc(rows)  # noqa: E731
            self.guard.sent(info, self.predictions_topic, on_refused=on_refused)

    def _properties(self, content_type: str | None) -> Properties | None:
        if self.protocol != "5" or not content_type:
            return None
        properties = Properties(PacketTypes.PUBLISH)
        properties.ContentType = content_type
        return properties


def _finite_rows(array: np.ndarray, n: int) -> np.ndarray:
    """Per row of ``array`` (n rows), whether every value in it is finite."""
    return np.asarray(np.isfinite(np.asarray(array, np.float32).reshape(n, -1)).all(axis=1))


def recorder_for(
    settings: Settings,
    model: str,
    address: BrokerAddress | Sequence[BrokerAddress],
    metrics: Metrics,
    client_id: str,
    protocol: str | None = None,
) -> PredictionRecorder:
    """The recorder of ``model`` in a serving process, with its topics and buffer size."""
    return PredictionRecorder(
        model,
        (settings.predictions_topic(model), settings.labels_topic(model)),
        address,
        settings.broker,
        client_id,
        metrics,
        max_rows=settings.models[model].labels.record_buffer_rows,
        protocol=protocol,
    )
