"""What becomes of a PUBLISH (``PublishGuard``): never one larger than the broker takes, and
every one the broker refuses counted and logged.

A broker disconnects a client that sends a packet over its Maximum Packet Size (MQTT 5 says so
in CONNACK; mosquitto ``max_packet_size``, AWS IoT Core 128 KB), and paho resends an unacked
QoS 1 message after the reconnect: one oversize message would cut the connection again and
again, and everything else on it (ingestion) with it. So a guard refuses to send a packet over
the limit (the smaller of ``broker.max_packet_size_bytes`` and the broker's CONNACK value) and
counts it. A QoS 1 PUBLISH the broker answers with a failure reason (MQTT 5 PUBACK >= 0x80:
"Not authorized" from an ACL, "Quota exceeded" ...) is counted too; paho would otherwise mark
it published. Both go to ``livefit_broker_publish_refused_total{topic, reason}`` and an error
log line (the first per topic and reason, then at most one a minute with the count).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.properties import Properties

from ..base.metrics import Metrics
from .metrics import PublishRefusedMetrics

log = logging.getLogger(__name__)
OVERSIZE = "over_max_packet_size"  # the reason label of a publish the guard did not send
REFUSAL_LOG_GAP_S = 60.0
_MAX_EARLY = 1024  # refusals whose publish call has not returned yet, kept at most


def publish_packet_bytes(
    topic: str, payload: bytes, qos: int, properties: Properties | None, mqtt5: bool
) -> int:
    """The size of the PUBLISH packet for this message, fixed header included (what a broker
    compares with its Maximum Packet Size)."""
    remaining = 2 + len(topic.encode()) + (2 if qos > 0 else 0) + len(payload)
    if mqtt5:
        remaining += len(properties.pack()) if properties is not None else 1
    length_bytes = 1
    while remaining >= 128**length_bytes:
        length_bytes += 1
    return 1 + length_bytes + remaining


def _answered(info: paho.MQTTMessageInfo) -> bool:
    """Whether the broker already answered the message paho took (QoS 0: at once); False for
    one paho holds until the connection is back (``MQTT_ERR_NO_CONN``: it is sent then)."""
    if info.rc not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):
        return True  # not queued at all (its queue was full): no answer will come
    try:
        return info.is_published()
    except (ValueError, RuntimeError):  # paho raises for any rc but success
        return False


class PublishTicket:
    """One sent message: ``refused`` is the broker's reason once it refused it (set before
    paho's ``wait_for_publish`` returns), None while accepted or not yet answered."""

    __slots__ = ("info", "on_refused", "refused", "topic")

    def __init__(
        self, info: paho.MQTTMessageInfo, topic: str, on_refused: Callable[[], None] | None
    ) -> None:
        self.info, self.topic, self.on_refused = info, topic, on_refused
        self.refused: str | None = None


class PublishGuard:
    """Checks each PUBLISH against the broker's packet limit and counts what the broker refuses.

    ``limit_bytes``: the configured limit (None: none); ``connected`` narrows it to the
    broker's CONNACK Maximum Packet Size for the connection's lifetime. Install ``on_publish``
    as the paho client's on_publish callback and call ``sent`` with each publish's info."""

    def __init__(self, metrics: Metrics, what: str, limit_bytes: int | None = None) -> None:
        metrics.group(PublishRefusedMetrics)
        self.refused_total = metrics.group(PublishRefusedMetrics).broker_publish_refused
        self.what = what  # who publishes, for the log: "learner demo", "replica recorder demo"
        self.configured_bytes = limit_bytes
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._pending: dict[int, PublishTicket] = {}
        self._early: dict[int, str] = {}  # refusals that came before ``sent`` was called
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}  # last log time, unlogged

    def connected(self, connack_properties: Any) -> None:
        """A new connection: the limit is the broker's Maximum Packet Size where it sent one."""
        broker = getattr(connack_properties, "MaximumPacketSize", None)
        limits = [v for v in (self.configured_bytes, broker) if v]
        self.limit_bytes = min(limits) if limits else None

    def fits(
        self, topic: str, payload: bytes, qos: int, properties: Properties | None, mqtt5: bool
    ) -> bool:
        """Whether the broker takes this message's PUBLISH packet."""
        if self.limit_bytes is None:
            return True
        return publish_packet_bytes(topic, payload, qos, properties, mqtt5) <= self.limit_bytes

    def oversize(self, topic: str, size_bytes: int) -> None:
        """A message was not sent: its PUBLISH would be over the limit."""
        self._refused(
            topic, OVERSIZE,
            f"a {size_bytes}-byte PUBLISH is over the broker's maximum packet size of "
            f"{self.limit_bytes} bytes (broker max_packet_size, broker.max_packet_size_bytes); "
            "not sent",
        )  # fmt: skip

    def sent(
        self, info: paho.MQTTMessageInfo, topic: str, on_refused: Callable[[], None] | None = None
    ) -> PublishTicket:
        """Track the message paho took (``info``) until the broker answers; ``on_refused`` is
        called (on paho's thread, or here) if the broker refuses it."""
        ticket = PublishTicket(info, topic, on_refused)
        with self._lock:
            refused = self._early.pop(info.mid, None)
            if refused is None and not _answered(info):
                self._pending[info.mid] = ticket
        if refused is not None:
            self._refuse(ticket, refused)
        return ticket

    def on_publish(
        self, client: paho.Client, userdata: Any, mid: int, reason: Any, properties: Any
    ) -> None:
        """paho's on_publish (callback API 2): a refusal counts against the message's topic."""
        failed = bool(getattr(reason, "is_failure", False))
        with self._lock:
            ticket = self._pending.pop(mid, None)
            if ticket is None:
                if failed and len(self._early) < _MAX_EARLY:  # ``sent`` not called yet
                    self._early[mid] = str(reason)
                return
        if failed:
            self._refuse(ticket, str(reason))

    def _refuse(self, ticket: PublishTicket, reason: str) -> None:
        ticket.refused = reason
        if ticket.on_refused is not None:
            ticket.on_refused()
        self._refused(ticket.topic, reason, "the broker refused it (PUBACK)")

    def forget(self) -> None:
        """The connection is gone for good: nothing pending is answered any more."""
        with self._lock:
            self._pending.clear()
            self._early.clear()

    def _refused(self, topic: str, reason: str, detail: str) -> None:
        self.refused_total.labels(topic=topic, reason=reason).inc()
        now = time.monotonic()
        with self._lock:
            logged_at, unlogged = self._logged.get((topic, reason), (-REFUSAL_LOG_GAP_S, 0))
            if now - logged_at < REFUSAL_LOG_GAP_S:
                self._logged[(topic, reason)] = (logged_at, unlogged + 1)
                return
            self._logged[(topic, reason)] = (now, 0)
        more = f" ({unlogged} more since the last line)" if unlogged else ""
        log.error(
            "%s: a publish on %s was refused: %s: %s%s; counted in "
            "livefit_broker_publish_refused_total",
            self.what, topic, reason, detail, more,
        )  # fmt: skip
