"""`livefit publish`: stream training samples to the server over MQTT.

SamplePublisher keeps at most ``window`` messages unacknowledged (paho has 65,535 message ids and
no flow control of its own), paces to a rate in samples per second, stamps every message with
``ts``, ``source`` and an increasing ``seq``, and sets the MQTT 5 ContentType. ``add_arguments``
and ``run`` are the CLI subcommand that livefit/cli.py mounts.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from livefit.clients.payloads import CONTENT_TYPES, Format, encode_samples
from livefit.clients.synthetic import cycle_chunks, load_file, stream_chunks, stream_for_shape
from livefit.server.messaging.broker import parse_broker_url

MAX_WINDOW = 65_535  # paho's message ids; beyond this publish() fails with MQTT_ERR_QUEUE_SIZE
Chunks = Iterable[tuple[np.ndarray, np.ndarray]]
_PROTOCOLS = {"5": MQTTProtocolVersion.MQTTv5, "3.1.1": MQTTProtocolVersion.MQTTv311}


class BrokerConnectionError(ConnectionError):
    """The broker could not be reached, or refused the connection; the message says which."""


class ProtocolUnsupported(BrokerConnectionError):
    """The broker refused the MQTT version (amqtt refuses MQTT 5)."""


class PublishError(RuntimeError):
    """A message could not be handed to the broker."""


class PublishTimeout(PublishError, TimeoutError):
    """Messages stayed unacknowledged: no PUBACK arrived for the publisher's ack timeout."""


@dataclass(frozen=True, slots=True)
class PublishStats:
    """What one publish_stream call sent; ``seconds`` runs until the last acknowledgement."""

    samples: int
    messages: int
    seconds: float
    rejected: int = 0  # PUBACKs with a failure reason code (MQTT 5), e.g. not authorized
    dropped: int = 0  # QoS 0 messages lost to a disconnection

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        line = (
            f"published {self.samples} samples in {self.messages} messages in "
            f"{self.seconds:.2f} s ({self.samples_per_s:,.0f} samples/s)"
        )
        if self.rejected or self.dropped:
            line += f"; {self.rejected} rejected by the broker, {self.dropped} dropped"
        return line


class RatePacer:
    """Holds a stream to ``rate`` samples/s on average.

    Each message is due at start + samples_before_it / rate, so sleep overshoot never adds up.
    """

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 samples/s, got {rate}")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None

    def wait(self, samples_sent: int) -> None:
        """Block until the message that follows ``samples_sent`` samples is due."""
        now = self._clock()
        if self._start is None:
            self._start = now
        delay = self._start + samples_sent / self.rate - now
        if delay > 0:
            self._sleep(delay)


class SamplePublisher:
    """Publishes sample messages to one topic with at most ``window`` of them unacknowledged.

    Use as a context manager (connect, then flush and disconnect on exit) or call connect(),
    publish()/publish_stream(), flush() and close(). close() always stops paho's thread.
    """

    def __init__(
        self,
        broker_url: str,
        topic: str,
        *,
        fmt: Format = "msgpack",
        raw: bool = False,
        qos: int = 1,
        window: int = 1000,
        source: str | None = None,
        protocol: Literal["5", "3.1.1"] = "5",
        client_id: str = "",
        connect_timeout_s: float = 10.0,
        ack_timeout_s: float = 60.0,
        ca_certs: str | None = None,
        fall_back_to_311: bool = False,
    ) -> None:
        """``fall_back_to_311``: with ``protocol`` 5, speak MQTT 3.1.1 to a broker that refuses
        5 as unsupported (``protocol`` then says which was used)."""
        if fmt not in CONTENT_TYPES:
            raise ValueError(f"format must be one of {sorted(CONTENT_TYPES)}, got {fmt!r}")
        if raw and fmt != "msgpack":
            raise ValueError("raw buffers need the msgpack format")
        if qos not in (0, 1):
            raise ValueError(f"qos must be 0 or 1, got {qos}")
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window must be between 1 and {MAX_WINDOW}, got {window}")
        self.address = parse_broker_url(broker_url)
        self.topic, self.fmt, self.raw, self.qos, self.window = topic, fmt, raw, qos, window
        self.source = source
        self.protocol = protocol
        self.fall_back_to_311 = fall_back_to_311
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.ack_timeout_s = ack_timeout_s
        self.ca_certs = ca_certs
        self._client: mqtt.Client | None = None
        self._lock = threading.Condition()
        self._in_flight = 0
        self._max_in_flight = 0
        self._limit = window  # lowered to the broker's Receive Maximum on connect
        self._acks = 0
        self._rejected = 0
        self._dropped = 0
        self._seq = 0
        self._connected = threading.Event()
        self._connack: ReasonCode | None = None
        self._properties = self._publish_properties()

    @property
    def in_flight(self) -> int:
        """Messages handed to paho and not yet acknowledged (QoS 1) or written (QoS 0)."""
        return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most messages ever in flight at once; never more than ``window``."""
        return self._max_in_flight

    @property
    def client(self) -> mqtt.Client:
        """The connected paho client; RuntimeError before connect() or after close()."""
        if self._client is None:
            raise RuntimeError("SamplePublisher is not connected: call connect() first")
        return self._client

    def connect(self) -> None:
        """Connect and start paho's thread; BrokerConnectionError within connect_timeout_s."""
        if self._client is not None:
            raise RuntimeError("SamplePublisher is already connected")
        self._connected.clear()
        self._connack = None
        client = self._make_client()
        try:
            client.connect(self.address.host, self.address.port, keepalive=30)
        except OSError as exc:
            raise BrokerConnectionError(
                f"cannot reach the MQTT broker at {self.address}: {exc}"
            ) from exc
        client.loop_start()
        self._client = client
        try:
            self._await_connack()
        except ProtocolUnsupported:
            if self.protocol != "5" or not self.fall_back_to_311:
                raise
            self.protocol = "3.1.1"  # as the learner does with such a broker
            self._properties = self._publish_properties()
            self.connect()

    def publish(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        batched: bool,
        w: float | np.ndarray | None = None,
        id: str | None = None,
    ) -> int:
        """Send one message (one sample, or a batch); block while ``window`` are in flight.

        Returns the message's ``seq``. Raises PublishTimeout when the window stays full for
        ack_timeout_s, PublishError when paho refuses the message.
        """
        client = self.client
        self._acquire_slot()
        try:
            seq = self._seq
            payload = encode_samples(
                x,
                y,
                fmt=self.fmt,
                batched=batched,
                raw=self.raw,
                w=w,
                ts=time.time(),
                source=self.source,
                seq=seq,
                id=id,
            )
            self._seq += 1
            info = client.publish(self.topic, payload, qos=self.qos, properties=self._properties)
        except BaseException:
            self._release_slot()
            raise
        self._check_result(info.rc)
        return seq

    def publish_payload(self, payload: bytes) -> None:
        """Send one ready-made message (delayed labels) under the same window and QoS."""
        client = self.client
        self._acquire_slot()
        try:
            info = client.publish(self.topic, payload, qos=self.qos, properties=self._properties)
        except BaseException:
            self._release_slot()
            raise
        self._check_result(info.rc)

    def publish_stream(
        self,
        chunks: Chunks,
        *,
        batch: int = 1,
        rate: float = 0.0,
        on_progress: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> PublishStats:
        """Publish every sample of ``chunks`` (pairs x [n, ...], y [n, ...]) and wait for acks.

        ``batch`` samples go in one message (1: single-sample messages); ``rate`` > 0 caps
        samples/s. ``on_progress`` gets the sample count of each message sent.
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        pacer = RatePacer(rate) if rate > 0 else None
        rejected, dropped = self._rejected, self._dropped
        start = time.monotonic()
        samples = messages = 0
        for xs, ys in _messages(chunks, batch):
            if stop is not None and stop.is_set():
                break
            if pacer is not None:
                pacer.wait(samples)
            if batch == 1:
                self.publish(xs[0], ys[0], batched=False)
            else:
                self.publish(xs, ys, batched=True)
            samples, messages = samples + len(xs), messages + 1
            if on_progress is not None:
                on_progress(len(xs))
        if not self.flush():
            raise self._timeout("at the end of the stream")
        seconds = time.monotonic() - start
        return PublishStats(
            samples, messages, seconds, self._rejected - rejected, self._dropped - dropped
        )

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is in flight; False if no ack came for timeout_s (ack_timeout_s)."""
        with self._lock:
            return self._wait_for(lambda: self._in_flight == 0, timeout_s)

    def close(self) -> None:
        """Disconnect and stop paho's thread; unacknowledged messages are abandoned."""
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()

    def __enter__(self) -> SamplePublisher:
        self.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None and not self.flush():
                raise self._timeout("on exit")
        finally:
            self.close()

    def _publish_properties(self) -> Properties | None:
        if self.protocol != "5":
            return None
        properties = Properties(PacketTypes.PUBLISH)
        properties.ContentType = CONTENT_TYPES[self.fmt]
        return properties

    def _make_client(self) -> mqtt.Client:
        version = _PROTOCOLS[self.protocol]
        client = mqtt.Client(CallbackAPIVersion.VERSION2, self.client_id, protocol=version)
        client.connect_timeout = self.connect_timeout_s
        client.max_inflight_messages_set(self.window)  # paho's default of 20 throttles QoS 1
        if self.address.username is not None:
            client.username_pw_set(self.address.username, self.address.password)
        if self.address.tls:
            client.tls_set(ca_certs=self.ca_certs)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.on_disconnect = self._on_disconnect
        return client

    def _await_connack(self) -> None:
        answered = self._connected.wait(self.connect_timeout_s)
        reason = self._connack
        if answered and reason is not None and not reason.is_failure:
            return
        self.close()
        if not answered:
            raise BrokerConnectionError(
                f"no answer (CONNACK) from the MQTT broker at {self.address} "
                f"within {self.connect_timeout_s:g} s"
            )
        if getattr(reason, "value", None) == 0x84:
            raise ProtocolUnsupported(
                f"the MQTT broker at {self.address} refused us: {reason} (MQTT {self.protocol}; "
                "amqtt speaks 3.1.1 only: --mqtt-version 3.1.1)"
            )
        raise BrokerConnectionError(f"the MQTT broker at {self.address} refused us: {reason}")

    # paho callbacks: run on paho's thread, only update counters under the lock.
    def _on_connect(
        self,
        client: mqtt.Client,
        _userdata: Any,
        _flags: Any,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if not reason_code.is_failure:
            # paho ignores the broker's Receive Maximum; exceeding it is a protocol error.
            receive_max = getattr(properties, "ReceiveMaximum", MAX_WINDOW)
            with self._lock:
                self._limit = min(self.window, receive_max)
                self._lock.notify_all()
        self._connack = reason_code
        self._connected.set()

    def _on_publish(
        self, _client: Any, _userdata: Any, _mid: int, reason_code: ReasonCode, _props: Any
    ) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._acks += 1
            if reason_code.is_failure:
                self._rejected += 1
            self._lock.notify_all()

    def _on_disconnect(self, *_: Any) -> None:
        if self.qos == 0:  # paho drops unsent QoS 0 packets on reconnect; they never get acked
            with self._lock:
                self._dropped += self._in_flight
                self._in_flight = 0
                self._lock.notify_all()

    def _acquire_slot(self) -> None:
        with self._lock:
            if not self._wait_for(lambda: self._in_flight < self._limit, None):
                raise self._timeout(f"with the window of {self.window} full")
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _release_slot(self, dropped: int = 0) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._dropped += dropped
            self._lock.notify_all()

    def _wait_for(self, condition: Callable[[], bool], timeout_s: float | None) -> bool:
        """With the lock held: wait until ``condition``; False after timeout_s without an ack."""
        timeout_s = self.ack_timeout_s if timeout_s is None else timeout_s
        acks, progress_at = self._acks, time.monotonic()
        while not condition():
            if self._acks != acks:
                acks, progress_at = self._acks, time.monotonic()
            remaining = progress_at + timeout_s - time.monotonic()
            if remaining <= 0:
                return False
            self._lock.wait(remaining)
        return True

    def _check_result(self, rc: MQTTErrorCode) -> None:
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            return
        if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            if self.qos == 1:
                return  # paho keeps it and sends it after reconnecting; on_publish follows
            self._release_slot(dropped=1)
            return
        self._release_slot()
        raise PublishError(f"paho refused the message: {mqtt.error_string(rc)}")

    def _timeout(self, when: str) -> PublishTimeout:
        return PublishTimeout(
            f"{self._in_flight} messages unacknowledged {when}: no PUBACK from the broker at "
            f"{self.address} for {self.ack_timeout_s:g} s"
        )


def _messages(chunks: Chunks, batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for x, y in chunks:
        if len(x) != len(y):
            raise ValueError(f"a chunk has {len(x)} inputs but {len(y)} targets")
        for start in range(0, len(x), batch):
            yield x[start : start + batch], y[start : start + batch]


class RejectionWatcher:
    """Listens, on a publisher's connection, for what the learner says about its messages.

    It subscribes to the model's dead-letter topic, where a learner reports every message it
    rejects (JSON with ``topic``, ``reason``, ``detail`` and the start of the payload), and
    counts the reports of this publisher's messages: those on its topic whose echoed payload
    holds its ``source`` (or was cut before it). It also subscribes to the weights topic until
    the first message: a learner publishes its weights there (retained) from its first start,
    so a retained message means some learner has served this model on this broker.

    ``nothing_listens`` is the heuristic ``livefit publish`` warns on: the broker granted both
    subscriptions, no weights message came and no rejection was reported.
    """

    def __init__(
        self,
        client: mqtt.Client,
        topic: str,
        dead_letter_topic: str,
        weights_topic: str,
        source: str | None,
    ) -> None:
        self.client = client
        self.topic = topic
        self.dead_letter_topic = dead_letter_topic
        self.weights_topic = weights_topic
        self.source = source.encode() if source else None
        self.rejected = 0
        self.first: tuple[str, str] | None = None  # (reason, detail) of the first report
        self.weights_seen = False
        self.granted: dict[str, bool] = {}
        self._pending: dict[int, str] = {}
        self._changed = threading.Condition()
        self._last_report = 0.0

    def start(self, timeout_s: float = 5.0) -> None:
        """Subscribe to both topics and wait (up to ``timeout_s``) for the broker's answers."""
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        with self._changed:
            for topic in (self.dead_letter_topic, self.weights_topic):
                result, mid = self.client.subscribe(topic, qos=1)
                if result == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                    self._pending[mid] = topic
            self._changed.wait_for(lambda: not self._pending, timeout_s)

    def settle(self, quiet_s: float, max_s: float = 10.0) -> None:
        """Wait for late reports: until none came for ``quiet_s`` (at most ``max_s``). When no
        learner seems to be there, only a moment for a retained weights message in flight."""
        start = time.monotonic()
        with self._changed:
            if self.nothing_listens:
                self._changed.wait_for(lambda: not self.nothing_listens, min(quiet_s, 0.25))
                if self.nothing_listens:
                    return
            while True:
                wake = min(max(start, self._last_report) + quiet_s, start + max_s)
                remaining = wake - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(remaining)

    @property
    def watching(self) -> bool:
        """Whether the broker let us read the dead-letter topic (an ACL may not)."""
        return self.granted.get(self.dead_letter_topic, False)

    @property
    def nothing_listens(self) -> bool:
        return (
            self.watching
            and self.granted.get(self.weights_topic, False)
            and not self.weights_seen
            and self.rejected == 0
        )

    def _on_subscribe(
        self, client: mqtt.Client, _userdata: Any, mid: int, reason_codes: list[Any], _props: Any
    ) -> None:
        with self._changed:
            topic = self._pending.pop(mid, None)
            if topic is not None:
                self.granted[topic] = bool(reason_codes) and not reason_codes[0].is_failure
            self._changed.notify_all()

    def _on_message(self, client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.weights_topic:
            with self._changed:
                first = not self.weights_seen
                self.weights_seen = True
                self._changed.notify_all()
            if first:
                client.unsubscribe(self.weights_topic)  # one is enough; they are large
            return
        report = _rejection_report(bytes(message.payload))
        if report is None or report.get("topic") != self.topic or not self._ours(report):
            return
        with self._changed:
            self.rejected += 1
            if self.first is None:
                self.first = (str(report.get("reason")), str(report.get("detail")))
            self._last_report = time.monotonic()
            self._changed.notify_all()

    def _ours(self, report: dict[str, Any]) -> bool:
        if self.source is None or report.get("payload_truncated"):
            return True
        try:
            echoed = base64.b64decode(str(report.get("payload_base64", "")), validate=True)
        except ValueError:
            return True
        return self.source in echoed


def _rejection_report(payload: bytes) -> dict[str, Any] | None:
    try:
        report = json.loads(payload)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


# ---------------------------------------------------------------------------------------------
# The `livefit publish` subcommand.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `livefit publish` to ``parser``."""
    add = parser.add_argument
    add(
        "--broker",
        default="mqtt://127.0.0.1:1883",
        metavar="URL",
        help="mqtt://[user:pass@]host[:port] or mqtts://... (default %(default)s)",
    )
    add("--model", default="demo", help="model name (default %(default)s)")
    add("--topic", help="topic to publish to (default livefit/<model>/samples)")
    add(
        "--source",
        default="synthetic",
        metavar="synthetic|PATH",
        help="'synthetic' (y = linear function of x + noise) or a .npz/.npy/.csv file",
    )
    add(
        "--input-shape",
        metavar="SHAPE",
        help="input shape, e.g. 8 or 20,3 (synthetic default 8; for a file, reshapes its rows)",
    )
    add(
        "--output-dim",
        metavar="N",
        type=_positive_int,
        default=1,
        help="synthetic targets per sample",
    )
    add(
        "--target-columns",
        metavar="N",
        type=_positive_int,
        default=1,
        help="last columns of a .npy/.csv file that are targets (default %(default)s)",
    )
    add(
        "--count",
        metavar="N",
        type=_positive_int,
        help="samples to publish (default 10000 synthetic; a file's rows once, cycling if more)",
    )
    add(
        "--rate",
        type=_non_negative_float,
        default=0.0,
        metavar="SAMPLES_PER_S",
        help="samples per second, 0 = as fast as the window allows (default 0)",
    )
    add(
        "--batch",
        metavar="N",
        type=_positive_int,
        default=1,
        help="samples per message (default 1)",
    )
    add(
        "--format",
        choices=sorted(CONTENT_TYPES),
        default="msgpack",
        dest="fmt",
        help="payload format (default %(default)s)",
    )
    add("--raw", action="store_true", help="msgpack raw little-endian buffers instead of lists")
    add("--qos", type=int, choices=(0, 1), default=1, help="MQTT QoS (default %(default)s)")
    add(
        "--window",
        metavar="N",
        type=_window,
        default=1000,
        help="most unacknowledged messages at once (default %(default)s)",
    )
    add(
        "--seed", metavar="N", type=int, default=0, help="synthetic data seed (default %(default)s)"
    )
    add(
        "--noise",
        type=_non_negative_float,
        default=0.01,
        help="synthetic noise std (default %(default)s)",
    )
    add("--source-id", metavar="ID", help="the payload's 'source' field (default <hostname>-<pid>)")
    add(
        "--mqtt-version",
        choices=("auto", "5", "3.1.1"),
        default="auto",
        help="MQTT protocol version; auto: 5, or 3.1.1 with a broker that speaks only that "
        "(default %(default)s)",
    )
    add(
        "--connect-timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="give up connecting after this long (default %(default)s)",
    )
    add("--ca-file", metavar="PATH", help="CA certificates for mqtts:// (default: the system's)")
    add("--no-progress", action="store_true", help="no progress bar")
    add(
        "--rejected-topic",
        metavar="TOPIC",
        help="the learner's dead-letter topic, where it reports rejected messages "
        "(default livefit/<model>/rejected; the model's dead_letter_topic)",
    )
    add(
        "--weights-topic",
        metavar="TOPIC",
        help="the model's weight topic, read once to see whether a learner serves it "
        "(default livefit/<model>/weights)",
    )
    add(
        "--rejection-wait",
        type=_non_negative_float,
        default=1.0,
        metavar="SECONDS",
        help="after the last acknowledgement, wait until no rejection was reported for this "
        "long (at most 10 s) (default %(default)s)",
    )
    add(
        "--no-check",
        action="store_true",
        help="do not listen for rejections nor warn when no learner seems to take the samples",
    )
    add(
        "--label-delay",
        type=int,
        metavar="N",
        help="delayed labels: predict each sample with an id through --server now, publish its "
        "label on livefit/<model>/labels N samples later (README 'Delayed labels')",
    )
    add(
        "--label-delay-random",
        action="store_true",
        help="with --label-delay: each label waits a uniform random 0 to N samples",
    )
    add(
        "--server",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="with --label-delay: the livefit server (learner or replica) that predicts",
    )


def run(args: argparse.Namespace) -> int:
    """Run `livefit publish`: 0 when every sample was acknowledged, 1 on a broker or publish
    failure or when the learner rejected every message, 2 on invalid options or an unreadable
    source, 130 when interrupted.

    Unless ``--no-check``, it listens on the model's dead-letter topic while it publishes and
    reports the rejections of its messages at the end, and warns when nothing seems to take
    the samples (``RejectionWatcher.nothing_listens``)."""
    try:
        chunks, count = _open_source(args)
        publisher = _make_publisher(args)
    except (ValueError, OSError) as exc:
        return _fail(str(exc), 2)
    if getattr(args, "label_delay", None) is not None:
        from livefit.clients.delayed import run_delayed

        return run_delayed(args, chunks, publisher)
    try:
        publisher.connect()
    except BrokerConnectionError as exc:
        return _fail(str(exc), 1)
    watcher = None
    try:
        if not getattr(args, "no_check", False):
            watcher = RejectionWatcher(
                publisher.client,
                publisher.topic,
                args.rejected_topic or f"livefit/{args.model}/rejected",
                args.weights_topic or f"livefit/{args.model}/weights",
                publisher.source,
            )
            watcher.start()
        with _progress_bar(count, enabled=not args.no_progress) as advance:
            stats = publisher.publish_stream(
                chunks,
                batch=args.batch,
                rate=args.rate,
                on_progress=advance,
                stop=getattr(args, "stop_event", None),
            )
        if watcher is not None:
            watcher.settle(args.rejection_wait)
    except PublishError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        publisher.close()
    print(f"{stats.summary()} to {publisher.topic} at {publisher.address}", flush=True)
    if stats.rejected or stats.dropped:
        return _fail(f"{stats.rejected + stats.dropped} messages were not delivered", 1)
    if watcher is not None:
        return _check_report(watcher, stats, args.model, str(publisher.address))
    return 0


def _check_report(watcher: RejectionWatcher, stats: PublishStats, model: str, broker: str) -> int:
    """What the learner said about the messages: 1 when it rejected every one of them."""
    if watcher.rejected:
        reason, detail = watcher.first or ("?", "?")
        first = " ".join(f"{reason}: {detail}".split())[:300]
        if watcher.rejected >= stats.messages:
            return _fail(
                f"the learner rejected every message ({watcher.rejected} of {stats.messages}), "
                f"the first for {first} (reports on {watcher.dead_letter_topic})",
                1,
            )
        _warn(
            f"the learner rejected {watcher.rejected} of {stats.messages} messages, the first "
            f"for {first} (reports on {watcher.dead_letter_topic})"
        )
    elif watcher.nothing_listens:
        _warn(
            f"no learner seems to serve model {model!r} on {broker}: no weights on "
            f"{watcher.weights_topic} and no rejection reports on {watcher.dead_letter_topic}. "
            f"Check that `livefit serve` runs against this broker with a model named {model!r} "
            f"(--model) whose topic is {watcher.topic} (--topic); until one subscribes, the "
            "broker keeps these samples only for a learner session it already knows"
        )
    return 0


def _warn(message: str) -> None:
    print(f"livefit publish: warning: {message}", file=sys.stderr, flush=True)


def parse_shape(text: str) -> tuple[int, ...]:
    """'8', '20,3' or '[20, 3]' -> a tuple of positive ints; ValueError otherwise."""
    cleaned = text.strip().strip("[]()")
    try:
        shape = tuple(int(part) for part in cleaned.split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"--input-shape must be positive integers like 8 or 20,3, got {text!r}")
    return shape


def _open_source(args: argparse.Namespace) -> tuple[Chunks, int]:
    chunk_size = args.batch * max(1, 4096 // args.batch)
    if args.source == "synthetic":
        shape = parse_shape(args.input_shape or "8")
        stream = stream_for_shape(shape, args.output_dim, args.noise, args.seed)
        count = args.count or 10_000
        return stream_chunks(stream, count, chunk_size), count
    x, y = load_file(args.source, args.target_columns)
    if args.input_shape:
        x = _reshape_inputs(x, parse_shape(args.input_shape), args.source)
    count = args.count or len(x)
    return cycle_chunks(x, y, count, chunk_size), count


def _reshape_inputs(x: np.ndarray, shape: tuple[int, ...], path: str) -> np.ndarray:
    if int(np.prod(x.shape[1:])) != int(np.prod(shape)):
        raise ValueError(
            f"{path}: samples of shape {list(x.shape[1:])} cannot be reshaped to {list(shape)}"
        )
    return x.reshape(len(x), *shape)


def _stream_kind(args: argparse.Namespace) -> str:
    return "labels" if getattr(args, "label_delay", None) is not None else "samples"


def _make_publisher(args: argparse.Namespace) -> SamplePublisher:
    return SamplePublisher(
        args.broker,
        args.topic or f"livefit/{args.model}/{_stream_kind(args)}",
        fmt="json" if _stream_kind(args) == "labels" else args.fmt,
        raw=args.raw and _stream_kind(args) == "samples",
        qos=args.qos,
        window=args.window,
        source=args.source_id or f"{socket.gethostname()}-{os.getpid()}",
        protocol="5" if args.mqtt_version == "auto" else args.mqtt_version,
        fall_back_to_311=args.mqtt_version == "auto",
        connect_timeout_s=args.connect_timeout,
        ca_certs=args.ca_file,
    )


class _SpeedColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} samples/s" if speed else "", style="progress.data.speed")


@contextmanager
def _progress_bar(total: int, *, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich bar on stderr, or a no-op when disabled or stderr is not a terminal."""
    console = Console(stderr=True)
    if not (enabled and console.is_terminal):
        yield lambda _n: None
        return
    columns = (TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), _SpeedColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("publish", total=total)
        yield lambda n: progress.advance(task, n)


def _fail(message: str, code: int) -> int:
    print(f"livefit publish: error: {message}", file=sys.stderr, flush=True)
    return code


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _window(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_WINDOW} (MQTT message ids)")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value
