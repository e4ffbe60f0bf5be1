"""livefit's MQTT session: paho-mqtt 2.x, persistent session, QoS 1, manual acknowledgement.

Callbacks stay tiny: ``on_message`` only puts the raw message on the inbox; ``on_connect``
checks the reason code and (re)subscribes. Messages are acknowledged by the ingest worker once
they are accepted into a model's queue (or rejected and reported), so a full queue stops the
acks, and the broker (which honours our MQTT 5 Receive Maximum) stops sending: backpressure.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from livefit.server.config import BrokerSettings, TlsSettings
from livefit.server.messaging.broker import BrokerAddress
from livefit.server.metrics import Metrics

log = logging.getLogger(__name__)
SESSION_TAKEN_OVER = 0x8E  # MQTT 5 DISCONNECT reason: a client with the same id connected
QUICK_DROP_S = 5.0  # a connection lost sooner than this after CONNACK counts as a quick drop
UNREACHABLE_LOG_MAX_S = 60.0  # failed attempts are logged at 0, 1, 2, 4 ... 60, 60 ... s apart


def apply_credentials(client: paho.Client, address: BrokerAddress, tls: TlsSettings) -> None:
    """Username/password from the URL, and TLS (CA, client certificate) for ``mqtts://``."""
    if address.username:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        client.tls_set(ca_certs=tls.ca_file, certfile=tls.cert_file, keyfile=tls.key_file)
        client.tls_insecure_set(tls.insecure)


def paho_client(
    client_id: str,
    address: BrokerAddress,
    settings: BrokerSettings,
    *,
    protocol: str | None = None,
    persistent: bool,
    manual_ack: bool = False,
) -> paho.Client:
    """A paho client with every broker setting applied: protocol, reconnect back-off, TLS and
    credentials. ``persistent``: the broker keeps the session across disconnects (MQTT 3.1.1
    clean_session false; MQTT 5 sets clean_start and the expiry at connect)."""
    v5 = (protocol or settings.protocol) == "5"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        clean_session=None if v5 else not persistent,
        manual_ack=manual_ack,
        reconnect_on_failure=True,
    )
    client.suppress_exceptions = True
    client.reconnect_delay_set(
        min_delay=max(1, round(settings.reconnect_min_s)),
        max_delay=max(1, round(settings.reconnect_max_s)),
    )
    apply_credentials(client, address, settings.tls)
    return client


REFUSAL_HINTS = {
    0x84: 'the broker does not speak MQTT 5 (amqtt: 3.1.1 only); set broker.protocol = "3.1.1"',
    0x86: "check the user and password in broker.url (or LIVEFIT_BROKER__URL)",
    0x87: "check the user and password in broker.url and the broker's ACL",
    0x85: "the broker refuses this client id (broker.client_id)",
}  # fmt: skip


class ConnectionStatus:
    """Whether one client is connected, and why not: its failed attempts since the last
    connection, counted, and logged at the first failure, then 1, 2, 4 ... up to 60 s apart
    (at once again when the failure changes, e.g. from unreachable to refused)."""

    def __init__(
        self, address: BrokerAddress, client_id: str, settings: BrokerSettings, what: str = ""
    ) -> None:
        self.address = address
        self.client_id = client_id
        self.retry_s = max(1, round(settings.reconnect_max_s))
        self.what = what  # e.g. "weight stream of demo: "; empty for the learner's samples
        self.connected = threading.Event()
        self.failures = 0
        self.refusal: str | None = None  # the broker's answer when it refused the last attempt
        self._logged_at = 0.0
        self._gap = 0.0

    def failed(self, refusal: Any = None) -> None:
        """An attempt failed: nothing answered (``refusal`` None) or the broker refused it
        (``refusal``: the CONNACK reason code)."""
        text = _refusal_text(refusal) if refusal is not None else None
        changed = text != self.refusal
        self.failures += 1
        self.refusal = text
        self.connected.clear()
        now = time.monotonic()
        if not changed and self.failures > 1 and now - self._logged_at < self._gap:
            return
        self._gap = 1.0 if changed or not self._gap else min(self._gap * 2, UNREACHABLE_LOG_MAX_S)
        self._logged_at = now
        attempts = "attempt" if self.failures == 1 else "attempts"
        if text is None:
            log.warning(
                "%sMQTT broker at %s unreachable for client id %r (%d connection %s failed); "
                "retrying every %d s at most",
                self.what, self.address, self.client_id, self.failures, attempts, self.retry_s,
            )  # fmt: skip
        else:
            log.error(
                "%sMQTT broker at %s refused the connection for client id %r: %s (%d connection "
                "%s failed); retrying every %d s at most",
                self.what, self.address, self.client_id, text, self.failures, attempts,
                self.retry_s,
            )  # fmt: skip

    def succeeded(self) -> int:
        """Connected; returns how many attempts had failed before."""
        failed, self.failures, self.refusal, self._gap = self.failures, 0, None, 0.0
        self.connected.set()
        return failed

    def reason(self) -> str:
        """Why there is no connection, for readiness and the dashboard."""
        attempts = "attempt" if self.failures == 1 else "attempts"
        if self.refusal is not None:
            return (
                f"MQTT broker at {self.address} refused the connection: {self.refusal} "
                f"({self.failures} connection {attempts} failed)"
            )
        if self.failures:
            return (
                f"MQTT broker at {self.address} unreachable "
                f"({self.failures} connection {attempts} failed)"
            )
        return f"not connected to the MQTT broker at {self.address}"


def _refusal_text(reason: Any) -> str:
    """paho's reason ("Not authorized") with what to do about it."""
    hint = REFUSAL_HINTS.get(getattr(reason, "value", -1))
    if hint is None and str(reason) in ("Not authorized", "Bad user name or password"):
        hint = REFUSAL_HINTS[0x86]
    return f"{reason}; {hint}" if hint else str(reason)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One connection attempt: connected, refused (with the broker's reason), or no answer."""

    connected: bool
    refused: Any = None  # the CONNACK reason code when the broker refused
    error: str = ""  # why nothing answered

    def describe(self) -> str:
        if self.connected:
            return "connected"
        return _refusal_text(self.refused) if self.refused is not None else self.error


def probe(
    address: BrokerAddress, settings: BrokerSettings, protocol: str, timeout_s: float = 3.0
) -> ProbeResult:
    """Connect once with ``protocol`` and a clean session, then disconnect."""
    client = paho_client("", address, settings, protocol=protocol, persistent=False)
    client.connect_timeout = timeout_s
    answers: list[Any] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: answers.append(reason)
    try:
        client.connect(address.host, address.port, keepalive=max(5, settings.keepalive_s))
        deadline = time.monotonic() + timeout_s
        while not answers and time.monotonic() < deadline:
            if client.loop(0.1) not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_AGAIN):
                break
    except (OSError, ValueError) as exc:
        return ProbeResult(False, error=str(exc) or type(exc).__name__)
    finally:
        with contextlib.suppress(Exception):
            client.disconnect()
    if not answers:
        return ProbeResult(False, error=f"no answer to CONNECT within {timeout_s:g} s")
    if answers[0].is_failure:
        return ProbeResult(False, refused=answers[0])
    return ProbeResult(True)


def for_broker(
    address: BrokerAddress, settings: BrokerSettings, protocol: str | None = None
) -> BrokerSettings:
    """The broker settings every client of this process uses with the broker at ``address``:
    ``settings`` with ``protocol`` (a broker livefit started says what it speaks), or with
    MQTT 3.1.1 where ``settings`` say 5 and the broker refuses 5 as unsupported (an amqtt),
    with a warning."""
    if protocol is not None or settings.protocol != "5":
        return settings.model_copy(update={"protocol": protocol or settings.protocol})
    first = probe(address, settings, "5", timeout_s=min(3.0, settings.connect_timeout_s))
    if first.refused is None or getattr(first.refused, "value", None) != 0x84:
        return settings
    if probe(address, settings, "3.1.1", timeout_s=min(3.0, settings.connect_timeout_s)).connected:
        log.warning(
            "MQTT broker at %s does not speak MQTT 5 (an amqtt?); using MQTT 3.1.1 "
            '(set broker.protocol = "3.1.1" to say so)', address,
        )  # fmt: skip
        return settings.model_copy(update={"protocol": "3.1.1"})
    return settings


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A message as it came off the wire, before any decoding."""

    mid: int
    qos: int
    topic: str
    payload: bytes
    content_type: str | None
    received_at: float


class MqttConnection:
    """One MQTT client: subscribes to sample topics, publishes reports, acks on request."""

    def __init__(
        self,
        address: BrokerAddress,
        settings: BrokerSettings,
        metrics: Metrics,
        protocol: str | None = None,
        client_id: str | None = None,
    ) -> None:
        self.address = address
        self.settings = settings
        self.metrics = metrics
        self.protocol = protocol or settings.protocol
        self.inbox: queue.Queue[RawMessage] = queue.Queue(maxsize=settings.receive_maximum * 2)
        self._stopping = threading.Event()
        self._subscriptions: list[tuple[str, int]] = []
        self.client_id = client_id or settings.client_id
        self.status = ConnectionStatus(address, self.client_id, settings)
        self.connected = self.status.connected
        self._connected_at = 0.0
        self._quick_drops = 0  # disconnects within QUICK_DROP_S of connecting, in a row
        self._client = self._make_client(self.client_id)

    def add_subscription(self, topic: str, qos: int = 1) -> None:
        """Subscribe to ``topic`` on every (re)connect. Call before ``start``."""
        self._subscriptions.append((topic, qos))

    def start(self) -> None:
        """Connect in the background; paho reconnects with backoff on its own after that."""
        a, s = self.address, self.settings
        kwargs: dict[str, Any] = {"keepalive": s.keepalive_s}
        if self.protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = s.session_expiry_s
            props.ReceiveMaximum = s.receive_maximum
            kwargs.update(clean_start=False, properties=props)
        self._client.connect_async(a.host, a.port, **kwargs)
        self._client.loop_start()

    def wait_connected(self, timeout: float) -> bool:
        return self.connected.wait(timeout)

    def not_connected_reason(self) -> str:
        """Why there is no connection, for readiness: unreachable or refused, with counts."""
        return self.status.reason()

    def stop(self) -> None:
        """Disconnect cleanly (the session, and what we did not ack, stays on the broker)."""
        self._stopping.set()
        self._drain_inbox()  # unblock paho's thread if it waits on a full inbox
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
            self.connected.clear()
            self.metrics.broker_connected.set(0)

    def _drain_inbox(self) -> None:
        """Drop what nobody will handle now: it was never acknowledged, so it is redelivered."""
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                return

    def ack(self, message: RawMessage) -> None:
        """Acknowledge ``message`` to the broker (QoS 0 needs none)."""
        if message.qos > 0:
            self._client.ack(message.mid, message.qos)

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        content_type: str | None = None,
        user_properties: list[tuple[str, str]] | None = None,
    ) -> paho.MQTTMessageInfo:
        """Publish; with QoS 1 paho keeps it and resends it after a reconnect."""
        properties = None
        if self.protocol == "5" and (content_type or user_properties):
            properties = Properties(PacketTypes.PUBLISH)
            if content_type:
                properties.ContentType = content_type
            if user_properties:
                properties.UserProperty = user_properties
        return self._client.publish(topic, payload, qos=qos, retain=retain, properties=properties)

    def _make_client(self, client_id: str) -> paho.Client:
        client = paho_client(
            client_id, self.address, self.settings, protocol=self.protocol, persistent=True,
            manual_ack=True,
        )  # fmt: skip
        client.max_inflight_messages_set(1000)
        client.max_queued_messages_set(0)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _on_connect_fail(self, client: paho.Client, userdata: Any) -> None:
        """A (re)connection attempt failed: nothing answered, or it timed out."""
        self.status.failed()

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        if reason.is_failure:  # e.g. bad credentials: said once, then with back-off
            self.status.failed(reason)
            return
        self._connected_at = time.monotonic()
        for topic, qos in self._subscriptions:
            client.subscribe(topic, qos=qos)
        resumed = bool(getattr(flags, "session_present", False))
        failed = self.status.succeeded()
        log.info(
            "MQTT connected to %s (session %s)%s", self.address,
            "resumed" if resumed else "new", f" after {failed} failed attempts" if failed else "",
        )  # fmt: skip
        self.metrics.broker_connects.inc()
        self.metrics.broker_connected.set(1)

    def _on_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        was_connected = self.connected.is_set()
        self.connected.clear()
        self.metrics.broker_connected.set(0)
        code = getattr(reason, "value", reason)
        if not was_connected:  # an attempt that ended before the broker accepted it
            if self.status.refusal is None and code != 0 and not self._stopping.is_set():
                self.status.failed()  # a refusal was counted and logged by _on_connect
            return
        if code == 0 or self._stopping.is_set():  # 0: the disconnect we asked for
            return
        self.metrics.broker_disconnects.inc()
        if code == SESSION_TAKEN_OVER:
            log.error(
                "MQTT session taken over: another client connected to %s with client id %r. "
                "Two processes must not share a client id (set broker.client_id); reconnecting",
                self.address, self.client_id,
            )  # fmt: skip
            return
        quick = was_connected and time.monotonic() - self._connected_at < QUICK_DROP_S
        self._quick_drops = self._quick_drops + 1 if quick else 0
        if self._quick_drops >= 3:
            log.error(
                "MQTT connection to %s dropped %d times within %.0f s of connecting (%s): "
                "another client probably uses client id %r; set broker.client_id",
                self.address, self._quick_drops, QUICK_DROP_S, reason, self.client_id,
            )  # fmt: skip
            return
        log.warning("MQTT disconnected from %s: %s; reconnecting", self.address, reason)

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
            )
            # Never blocks while the broker honours Receive Maximum; when stopping, the message is
            # left unacknowledged and the broker redelivers it to the next session.
            while not self._stopping.is_set():
                try:
                    self.inbox.put(raw, timeout=0.1)
                    break
                except queue.Full:
                    continue
        except Exception:
            self.metrics.internal_errors.labels(component="mqtt_on_message").inc()
            log.exception("could not enqueue an MQTT message on %s", message.topic)
