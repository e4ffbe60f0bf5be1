"""livefit's MQTT session: paho-mqtt 2.x, persistent session, QoS 1, manual acknowledgement.

Callbacks stay tiny: ``on_message`` only puts the raw message on the inbox; ``on_connect``
checks the reason code and (re)subscribes. Messages are acknowledged by the ingest worker once
they are accepted into a model's queue (or rejected and reported), so a full queue stops the
acks, and the broker (which honours our MQTT 5 Receive Maximum) stops sending: backpressure.
The paho client is built by ``paho_client``; connection failures are counted and explained by
``connection_status``; one-off probes of a broker are ``probe``'s. Every publish goes through
``publish_guard``: none larger than the broker's Maximum Packet Size is sent (an oversize PUBLISH
would make the broker cut this connection, ingestion with it), and refusals are counted.
A subscription may have its own handler (``add_subscription(..., handler=)``): its messages are
handed to it on paho's thread instead of the inbox (the learner watches its own weight topic).

Several broker nodes (a cluster): a lost connection or a failed attempt moves the session to
the next node (``failover``). An acknowledgement belongs to the connection its message came
on: each connection has a number (``RawMessage.session``), and an ack for a message of an
earlier connection is never sent (its packet id may name another message on the new one); the
cluster redelivers that message instead (at least once, never lost). A subscription a node
refuses is sent again after a wait (``failover.Resubscriber``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ..base.metrics import ErrorMetrics, Metrics
from ..config.broker_urls import BrokerAddress, as_nodes
from ..config.sections import BrokerSettings
from .connection_status import ConnectionStatus
from .failover import Failover, Resubscriber
from .metrics import BrokerMetrics
from .paho_client import paho_client
from .publish_guard import PublishGuard, publish_packet_bytes

log = logging.getLogger(__name__)
SESSION_TAKEN_OVER = 0x8E  # MQTT 5 DISCONNECT reason: a client with the same id connected
QUICK_DROP_S = 5.0  # a connection lost sooner than this after CONNACK counts as a quick drop
# After another client took the session over (same client id), readiness stays 503 this long
# (from the last take-over) and reconnecting waits as long: two processes with one client id
# take the session from each other, and neither ingests reliably while they do.
TAKEN_OVER_HOLD_S = 30.0


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A message as it came off the wire, before any decoding."""

    mid: int
    qos: int
    topic: str
    payload: bytes
    content_type: str | None
    received_at: float
    retained: bool = False  # a retained message the broker sent for a (re)subscription
    session: int = 0  # the number of the connection it came on (acks go on that one only)
    arrived: float = field(default_factory=time.monotonic)  # for durations: no wall-clock step


class MqttConnection:
    """One MQTT client: subscribes to sample topics, publishes reports, acks on request."""

    def __init__(
        self,
        address: BrokerAddress | Sequence[BrokerAddress],
        settings: BrokerSettings,
        metrics: Metrics,
        protocol: str | None = None,
        client_id: str | None = None,
    ) -> None:
        """``address``: the broker, or a cluster's nodes in the order they are tried."""
        nodes = as_nodes(address)
        self.settings = settings
        self.metrics = metrics
        metrics.group(BrokerMetrics)
        metrics.group(ErrorMetrics)
        self.protocol = protocol or settings.protocol
        self.inbox: queue.Queue[RawMessage] = queue.Queue(maxsize=settings.receive_maximum * 2)
        self._stopping = threading.Event()
        self._subscriptions: list[tuple[str, int, bool]] = []
        self._handlers: dict[str, Callable[[RawMessage], None]] = {}
        self.client_id = client_id or settings.client_id
        self.failover = Failover(nodes, settings, self.client_id, metrics)
        self.resubscriber = Resubscriber(f"MQTT client {self.client_id!r}")
        self.status = ConnectionStatus(nodes[0], self.client_id, settings, nodes=nodes)
        self._ack_lock = threading.Lock()  # an ack is sent on the connection it belongs to
        self._session = 0  # this connection's number: + 1 at every lost connection
        self.guard = PublishGuard(
            metrics, f"MQTT client {self.client_id!r}", settings.max_packet_size_bytes
        )
        self.connected = self.status.connected
        self._connected_at = 0.0
        # When the first connection's subscriptions were sent (monotonic; None before it).
        self.subscribed_at: float | None = None
        self._pending_subscriptions: dict[int, str] = {}  # SUBSCRIBE mid -> its topic
        self._quick_drops = 0  # disconnects within QUICK_DROP_S of connecting, in a row
        self._taken_over_at = -float("inf")  # monotonic time of the last take-over
        self._takeovers = 0  # take-overs since the last TAKEN_OVER_HOLD_S without one
        self._client = self._make_client(self.client_id)

    @property
    def address(self) -> BrokerAddress:
        """The broker node this client is connected to, or tries next."""
        return self.failover.current

    def add_subscription(
        self,
        topic: str,
        qos: int = 1,
        handler: Callable[[RawMessage], None] | None = None,
        no_local: bool = False,
    ) -> None:
        """Subscribe to ``topic`` on every (re)connect. Call before ``start``. With ``handler``
        (``topic`` a plain topic, QoS 0): its messages go to it, on paho's thread (it must not
        block), not to the inbox. ``no_local`` (MQTT 5): the broker does not send this client's
        own publishes back (retained messages it still sends at every subscribe)."""
        if handler is not None:
            self._handlers[topic] = handler
        self._subscriptions.append((topic, qos, no_local))

    def start(self) -> None:
        """Connect in the background; paho reconnects with backoff on its own after that (to
        the next node, with several)."""
        s = self.settings
        kwargs: dict[str, Any] = {"keepalive": s.keepalive_s}
        if self.protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = s.session_expiry_s
            props.ReceiveMaximum = s.receive_maximum
            kwargs.update(clean_start=False, properties=props)
        self.failover.start(self._client, **kwargs)
        self._client.loop_start()

    def wait_connected(self, timeout: float) -> bool:
        return self.connected.wait(timeout)

    def not_connected_reason(self) -> str:
        """Why there is no connection, for readiness: unreachable or refused, with counts."""
        return self.status.reason()

    def taken_over_reason(self) -> str | None:
        """Why readiness is 503 although connected, or soon will be: another client took this
        session over (same client id) within the last ``TAKEN_OVER_HOLD_S``; None otherwise."""
        if time.monotonic() - self._taken_over_at >= TAKEN_OVER_HOLD_S:
            return None
        times = "once" if self._takeovers == 1 else f"{self._takeovers} times"
        return (
            f"MQTT session taken over by another client with client id {self.client_id!r} "
            f"({times}, the last {time.monotonic() - self._taken_over_at:.0f} s ago): two "
            "processes must not share a client id (broker.client_id)"
        )

    def stop(self) -> None:
        """Disconnect cleanly (the session, and what we did not ack, stays on the broker)."""
        self._stopping.set()
        self.resubscriber.cancel()
        self._drain_inbox()  # unblock paho's thread if it waits on a full inbox
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
            self.connected.clear()
            self.failover.disconnected()
            self.metrics.group(BrokerMetrics).broker_connected.set(0)

    def _drain_inbox(self) -> None:
        """Drop what nobody will handle now: it was never acknowledged, so it is redelivered."""
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                return

    def ack(self, message: RawMessage) -> None:
        """Acknowledge ``message`` to the broker (QoS 0 needs none), on the connection it came
        on: after a reconnect (to another node or the same one) the ack is not sent and the
        broker redelivers the message."""
        if message.qos == 0:
            return
        with self._ack_lock:
            if message.session == self._session:
                self._client.ack(message.mid, message.qos)
                return
        log.debug("ack of mid %d dropped: its connection is gone", message.mid)

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        content_type: str | None = None,
        user_properties: list[tuple[str, str]] | None = None,
    ) -> paho.MQTTMessageInfo | None:
        """Publish; with QoS 1 paho keeps it and resends it after a reconnect. None: not sent,
        its PUBLISH is over the broker's maximum packet size (counted and logged)."""
        properties = self._properties(content_type, user_properties)
        mqtt5 = self.protocol == "5"
        if not self.guard.fits(topic, payload, qos, properties, mqtt5):
            self.guard.oversize(topic, publish_packet_bytes(topic, payload, qos, properties, mqtt5))
            return None
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        self.guard.sent(info, topic)
        return info

    def fits(
        self, topic: str, payload: bytes, qos: int = 1, content_type: str | None = None
    ) -> bool:
        """Whether this message's PUBLISH is within the broker's maximum packet size (known once
        connected: MQTT 5 CONNACK, or ``broker.max_packet_size_bytes``)."""
        properties = self._properties(content_type, None)
        return self.guard.fits(topic, payload, qos, properties, self.protocol == "5")

    def _properties(
        self, content_type: str | None, user_properties: list[tuple[str, str]] | None
    ) -> Properties | None:
        if self.protocol != "5" or not (content_type or user_properties):
            return None
        properties = Properties(PacketTypes.PUBLISH)
        if content_type:
            properties.ContentType = content_type
        if user_properties:
            properties.UserProperty = user_properties
        return properties

    def _make_client(self, client_id: str) -> paho.Client:
        client = paho_client(
            client_id, self.address, self.settings, protocol=self.protocol, persistent=True,
            manual_ack=True,
        )  # fmt: skip
        client.max_inflight_messages_set(1000)
        client.max_queued_messages_set(0)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_pre_connect = lambda _client, _userdata: self.failover.attempt_started()
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_publish = self.guard.on_publish
        return client

    def _on_subscribe(
        self, client: paho.Client, userdata: Any, mid: int, reasons: Any, props: Any
    ) -> None:
        """A SUBACK: a subscription the broker refused (a return code >= 0x80, which
        brokers send for an ACL that forbids the topic) is an error naming the topic."""
        topic = self._pending_subscriptions.pop(mid, "?")
        refused = [r for r in reasons if getattr(r, "is_failure", False)]
        if not refused:
            self.resubscriber.succeeded()
            return
        log.error(
            "the broker at %s refused the subscription to %s (%s): nothing will arrive on it%s; "
            "check the broker's ACL for user %r", self.address, topic, refused[0],
            " until it is sent again" if self.failover.several else "", self.address.username,
        )  # fmt: skip
        subscription = next((s for s in self._subscriptions if s[0] == topic), None)
        if self.failover.several and subscription is not None:
            self.resubscriber.refused(topic, lambda: self._subscribe(client, *subscription))

    def _subscribe(self, client: paho.Client, topic: str, qos: int, no_local: bool) -> None:
        if self.protocol == "5":
            _, mid = client.subscribe(topic, options=SubscribeOptions(qos=qos, noLocal=no_local))
        else:
            _, mid = client.subscribe(topic, qos=qos)
        if mid is not None:
            self._pending_subscriptions[mid] = topic

    def _on_connect_fail(self, client: paho.Client, userdata: Any) -> None:
        """A (re)connection attempt failed: nothing answered, or it timed out."""
        self.status.failed()
        self._next_node(client, "nothing answered")

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        if reason.is_failure:  # e.g. bad credentials: said once, then with back-off
            self.status.failed(reason)
            self._next_node(client, f"refused: {reason}")
            return
        self._connected_at = time.monotonic()
        self.failover.connected(client)
        self.guard.connected(props)
        s = self.settings
        client.reconnect_delay_set(  # back to the settings' delays after a take-over's wait
            min_delay=max(1, round(s.reconnect_min_s)), max_delay=max(1, round(s.reconnect_max_s))
        )
        for topic, qos, no_local in self._subscriptions:
            self._subscribe(client, topic, qos, no_local)
        if self.subscribed_at is None:
            self.subscribed_at = self._connected_at
        resumed = bool(getattr(flags, "session_present", False))
        failed = self.status.succeeded()
        log.info(
            "MQTT connected to %s (session %s)%s", self.address,
            "resumed" if resumed else "new", f" after {failed} failed attempts" if failed else "",
        )  # fmt: skip
        self.metrics.group(BrokerMetrics).broker_connects.inc()
        self.metrics.group(BrokerMetrics).broker_connected.set(1)

    def _on_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        was_connected = self.connected.is_set()
        with self._ack_lock:  # no ack of this connection's messages goes on the next one
            self._session += 1
        self.failover.disconnected()
        self.connected.clear()
        self.metrics.group(BrokerMetrics).broker_connected.set(0)
        code = getattr(reason, "value", reason)
        if not was_connected:  # an attempt that ended before the broker accepted it
            if self.status.refusal is None and code != 0 and not self._stopping.is_set():
                self.status.failed()  # a refusal was counted and logged by _on_connect
                self._next_node(client, f"no session: {reason}")
            return
        if code == 0 or self._stopping.is_set():  # 0: the disconnect we asked for
            return
        self.metrics.group(BrokerMetrics).broker_disconnects.inc()
        quick = time.monotonic() - self._connected_at < QUICK_DROP_S
        self._quick_drops = self._quick_drops + 1 if quick else 0
        if code == SESSION_TAKEN_OVER:  # MQTT 5 brokers that say so
            self._taken_over(client, "another client connected with client id")
            return
        if self._quick_drops >= 3:  # mosquitto 2.0 just closes the socket of the one taken over
            self._taken_over(
                client,
                f"the connection dropped {self._quick_drops} times in a row within "
                f"{QUICK_DROP_S:.0f} s of connecting ({reason}): another client probably uses "
                "client id",
            )
            return
        log.warning("MQTT disconnected from %s: %s; reconnecting", self.address, reason)
        self._next_node(client, f"connection lost: {reason}")

    def _next_node(self, client: paho.Client, why: str) -> None:
        """With several nodes, the next attempt goes to the next one (said in the log)."""
        self.failover.failed(client, why)
        self.status.address = self.failover.current

    def _taken_over(self, client: paho.Client, what: str) -> None:
        """Another client took this session over (or probably did): readiness is 503 for
        ``TAKEN_OVER_HOLD_S`` and reconnecting waits as long. Reconnecting at once would take
        the session back, and the other client would do the same, each ingesting a second at a
        time; this way the session stays with one of them, and the other one says why not."""
        now = time.monotonic()
        recent = now - self._taken_over_at < TAKEN_OVER_HOLD_S
        self._takeovers = self._takeovers + 1 if recent else 1
        self._taken_over_at = now
        wait = round(TAKEN_OVER_HOLD_S)
        client.reconnect_delay_set(min_delay=wait, max_delay=wait)
        log.error(
            "MQTT session at %s taken over: %s %r (take-over %d, each within %d s of the last). "
            "Two processes must not share a client id (set broker.client_id); readiness is 503 "
            "and reconnecting waits %d s",
            self.address, what, self.client_id, self._takeovers, wait, wait,
        )  # fmt: skip

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        try:
            content_type = (
                getattr(message.properties, "ContentType", None) if message.properties else None
            )
            raw = RawMessage(
                mid=message.mid,
                qos=message.qos,
                topic=message.topic,
                payload=bytes(message.payload),
                content_type=content_type,
                received_at=time.time(),
                retained=bool(message.retain),
                session=self._session,
            )
            handler = self._handlers.get(message.topic)
            if handler is not None:
                handler(raw)
                if message.qos > 0:
                    client.ack(message.mid, message.qos)
                return
            # Never blocks while the broker honours Receive Maximum; when stopping, the message is
            # left unacknowledged and the broker redelivers it to the next session.
            while not self._stopping.is_set():
                try:
                    self.inbox.put(raw, timeout=0.1)
                    break
                except queue.Full:
                    continue
        except Exception:
            self.metrics.group(ErrorMetrics).internal_errors.labels(
                component="mqtt_on_message"
            ).inc()
            log.exception("could not enqueue an MQTT message on %s", message.topic)
