"""SamplePublisher: sample messages to one MQTT topic with a bounded in-flight window.

It keeps at most ``window`` messages unacknowledged (paho has 65,535 message ids and no flow
control of its own), paces to a rate in samples per second (``pacing.RatePacer``), stamps every
message with ``ts``, ``source``, an increasing ``seq`` and the run's ``epoch`` (a random number
per publisher, so that a learner with ``dedup`` tells a new run numbering from 0 again from a
redelivery of the last one), and sets the MQTT 5 ContentType. It
owns its window (a ``publish_window.PublishWindow``, which its paho callbacks feed) and the paho
client; the CLI (``publish``) and the rejection watcher (``rejections``) only borrow it. The
errors it raises and the ``PublishStats`` of a stream are ``publish_results``'.

``broker_url`` may name a cluster's nodes (URLs separated by commas): it connects to the first
that answers and, when that connection is lost, goes on with the next (``server.mqtt.failover``);
paho resends what was in flight there, so every message is acknowledged by some node.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from livefit.server.config.broker_urls import BrokerAddress, parse_broker_urls
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.failover import Failover
from livefit.server.wire.formats import format_named

from .pacing import Chunks, RatePacer, split_messages
from .payloads import encode_samples
from .publish_results import (
    BrokerConnectionError,
    ProtocolUnsupported,
    PublishError,
    PublishStats,
    PublishTimeout,
)
from .publish_window import MAX_WINDOW, PublishWindow

_PROTOCOLS = {"5": MQTTProtocolVersion.MQTTv5, "3.1.1": MQTTProtocolVersion.MQTTv311}


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
        fmt: str = "msgpack",
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
        epoch: int | None = None,
    ) -> None:
        """``fall_back_to_311``: with ``protocol`` 5, speak MQTT 3.1.1 to a broker that refuses
        5 as unsupported (``protocol`` then says which was used). ``epoch``: this run's number
        (default: a random one); give the same one only to continue a run's ``seq``."""
        self._format = format_named(fmt, raw)  # ValueError for an unknown one
        if qos not in (0, 1):
            raise ValueError(f"qos must be 0 or 1, got {qos}")
        self._window = PublishWindow(window, ack_timeout_s)  # ValueError for a bad ``window``
        nodes = parse_broker_urls(broker_url)
        # Between full rounds of failed nodes paho waits 1 s doubling up to 4 s.
        timing = BrokerSettings(reconnect_min_s=1, reconnect_max_s=4)
        self._failover = Failover(nodes, timing, client_id or "publisher")
        self.topic, self.fmt, self.raw, self.qos, self.window = topic, fmt, raw, qos, window
        self.source = source
        self.protocol = protocol
        self.fall_back_to_311 = fall_back_to_311
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.ack_timeout_s = ack_timeout_s
        self.ca_certs = ca_certs
        self._client: mqtt.Client | None = None
        self._seq = 0
        self.epoch = secrets.randbits(63) if epoch is None else epoch
        self._connected = threading.Event()
        self._connack: ReasonCode | None = None
        self._properties = self._publish_properties()

    @property
    def address(self) -> BrokerAddress:
        """The broker node this publisher is connected to, or tries next."""
        return self._failover.current

    @property
    def in_flight(self) -> int:
        """Messages handed to paho and not yet acknowledged (QoS 1) or written (QoS 0)."""
        return self._window.in_flight

    @property
    def max_in_flight(self) -> int:
        """The most messages ever in flight at once; never more than ``window``."""
        return self._window.max_in_flight

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
        self._connect_first(client)
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
        self._take_slot()
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
                epoch=self.epoch,
            )
            self._seq += 1
            info = client.publish(self.topic, payload, qos=self.qos, properties=self._properties)
        except BaseException:
            self._window.release()
            raise
        self._check_result(info.rc)
        return seq

    def publish_payload(self, payload: bytes) -> None:
        """Send one ready-made message (delayed labels) under the same window and QoS."""
        client = self.client
        self._take_slot()
        try:
            info = client.publish(self.topic, payload, qos=self.qos, properties=self._properties)
        except BaseException:
            self._window.release()
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
        rejected, dropped = self._window.rejected, self._window.dropped
        start = time.monotonic()
        samples = messages = 0
        for xs, ys in split_messages(chunks, batch):
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
        rejected, dropped = self._window.rejected - rejected, self._window.dropped - dropped
        return PublishStats(samples, messages, seconds, rejected, dropped)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is in flight; False if no ack came for timeout_s (ack_timeout_s)."""
        return self._window.wait_empty(timeout_s)

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

    def _take_slot(self) -> None:
        if not self._window.acquire():
            raise self._timeout(f"with the window of {self.window} full")

    def _connect_first(self, client: mqtt.Client) -> None:
        """Open the socket to the first node that accepts it (each node once, in order)."""
        unreachable = []
        for _ in self._failover.rotation.nodes:
            node = self.address
            try:
                client.connect(node.host, node.port, keepalive=30)
                return
            except OSError as exc:
                unreachable.append(f"{node}: {exc}")
                self._failover.rotation.advance()
        raise BrokerConnectionError(f"cannot reach the MQTT broker at {'; '.join(unreachable)}")

    def _check_result(self, rc: MQTTErrorCode) -> None:
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            return
        if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            if self.qos == 1:
                return  # paho keeps it and sends it after reconnecting; on_publish follows
            self._window.release(dropped=1)
            return
        self._window.release()
        raise PublishError(f"paho refused the message: {mqtt.error_string(rc)}")

    def _timeout(self, when: str) -> PublishTimeout:
        return PublishTimeout(
            f"{self._window.in_flight} messages unacknowledged {when}: no PUBACK from the broker "
            f"at {self.address} for {self.ack_timeout_s:g} s"
        )

    def _publish_properties(self) -> Properties | None:
        if self.protocol != "5":
            return None
        properties = Properties(PacketTypes.PUBLISH)
        properties.ContentType = self._format.content_type
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
        client.on_connect_fail = lambda c, _u: self._failover.failed(c, "nothing answered")
        client.on_pre_connect = lambda _c, _u: self._failover.attempt_started()
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

    # paho callbacks: run on paho's thread, only update the window's counters.
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
            self._window.limit_to(getattr(properties, "ReceiveMaximum", MAX_WINDOW))
            self._failover.connected(client)
        elif self._connected.is_set():  # a reconnect refused: the next node
            self._failover.failed(client, f"refused: {reason_code}")
        self._connack = reason_code
        self._connected.set()

    def _on_publish(
        self, _client: Any, _userdata: Any, _mid: int, reason_code: ReasonCode, _props: Any
    ) -> None:
        self._window.acknowledged(failed=reason_code.is_failure)

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if self.qos == 0:  # paho drops unsent QoS 0 packets on reconnect; they never get acked
            self._window.drop_all()
        if getattr(reason, "value", reason) != 0 and self._client is not None:
            self._failover.failed(client, f"connection lost: {reason}")
