"""The weight stream over MQTT, shared by replicas and the client ``WeightSubscriber``.

A ``WeightReceiver`` is a ``WeightVerifier`` (``weights.verifier``: what is checked, in which
order, and the freshness rules) fed by its own paho client subscribed to one model's weight
topic, speaking the protocol, keepalive, reconnect back-off, TLS and credentials of the
``[broker]`` settings, failing over between a cluster's nodes (``mqtt.failover``; logged, not
counted: a replica has no ``livefit_broker_*`` series). The network thread only enqueues; the
verifier's thread does the rest.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

import paho.mqtt.client as paho

from ..config.broker_urls import BrokerAddress, as_nodes
from ..config.sections import BrokerSettings
from ..mqtt.connection_status import ConnectionStatus
from ..mqtt.failover import Failover, Resubscriber
from ..mqtt.paho_client import paho_client
from .receiver_auth import Authenticator
from .verifier import (
    DEFAULT_MAX_PULL_BYTES,
    ReceivedWeights,
    WeightVerifier,
)

log = logging.getLogger(__name__)


class WeightReceiver(WeightVerifier):
    """Subscribes to ``topic`` and delivers verified, newer weights to ``on_weights``."""

    def __init__(
        self,
        address: BrokerAddress | Sequence[BrokerAddress],
        model: str,
        topic: str,
        fingerprint: str | None,
        on_weights: Callable[[ReceivedWeights], None],
        auth: Authenticator,
        *,
        on_outcome: Callable[[str], None] | None = None,
        broker: BrokerSettings | None = None,
        client_id: str = "",
        pull_url: str | None = None,
        pull_timeout_s: float = 30.0,
        pull_headers: dict[str, str] | None = None,
        max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES,
        max_age_s: float = 86400.0,
        refused_unready_s: float = 0.0,
        on_record: Callable[[str], None] | None = None,
        on_held: Callable[[int, bytes], None] | None = None,
    ) -> None:
        """``on_held(version, payload)``: a payload retained on ``<topic>/held/<version>`` (a
        version the serving record names; the record's signed sha256 vouches for it, not this
        transport); called on the verifier's thread (``defer``), in order with the records,
        never on paho's."""
        super().__init__(
            model, topic, fingerprint, on_weights, auth, on_outcome=on_outcome,
            pull_url=pull_url, pull_timeout_s=pull_timeout_s, pull_headers=pull_headers,
            max_pull_bytes=max_pull_bytes, max_age_s=max_age_s,
            refused_unready_s=refused_unready_s, on_record=on_record,
        )  # fmt: skip
        self.on_held = on_held
        self.held_prefix = f"{topic}/held/"
        nodes = as_nodes(address)
        self.broker = broker or BrokerSettings()
        what = f"weight stream of {model}: "
        self.failover = Failover(nodes, self.broker, client_id, what=what)
        self.resubscriber = Resubscriber(f"weight stream of {model}")
        self.status = ConnectionStatus(nodes[0], client_id, self.broker, what=what, nodes=nodes)
        self.connected = self.status.connected
        self._client = self._make_client(client_id)

    @property
    def address(self) -> BrokerAddress:
        """The broker node this receiver is connected to, or tries next."""
        return self.failover.current

    def start(self) -> None:
        super().start()
        self.failover.start(self._client, keepalive=self.broker.keepalive_s)
        self._client.loop_start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.resubscriber.cancel()
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
        super().stop(timeout)

    def not_connected_reason(self) -> str:
        return self.status.reason()

    def _make_client(self, client_id: str) -> paho.Client:
        client = paho_client(client_id, self.failover.current, self.broker, persistent=False)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_pre_connect = lambda _client, _userdata: self.failover.attempt_started()
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        return client

    def _on_connect(
        self, client: paho.Client, userdata: object, flags: object, reason: object, props: object
    ) -> None:
        if getattr(reason, "is_failure", False):  # said once, then with back-off
            self.status.failed(reason)
            self._next_node(client, f"refused: {reason}")
            return
        self.failover.connected(client)
        client.subscribe(self.topic, qos=1)
        if self.on_held is not None:
            client.subscribe(f"{self.held_prefix}+", qos=1)
        failed = self.status.succeeded()
        if failed:
            log.info("weight stream of %s: connected to %s after %d failed attempts",
                     self.model, self.address, failed)  # fmt: skip

    def _on_disconnect(
        self, client: paho.Client, userdata: object, flags: object, reason: object, props: object
    ) -> None:
        was_connected = self.connected.is_set()
        self.connected.clear()
        code = getattr(reason, "value", reason)
        if code == 0 or self._stopping.is_set():
            return
        if was_connected:
            log.warning("weight stream of %s: disconnected from %s: %s; reconnecting",
                        self.model, self.address, reason)  # fmt: skip
        self._next_node(client, f"connection lost: {reason}")

    def _on_subscribe(
        self, client: paho.Client, userdata: object, mid: int, reasons: object, props: object
    ) -> None:
        """A refused subscription (an ACL, or a cluster node that cannot serve it yet) is an
        error naming the topic; with several nodes it is sent again after a wait."""
        refused = [r for r in (reasons if isinstance(reasons, list) else [reasons])
                   if getattr(r, "is_failure", False)]  # fmt: skip
        if not refused:
            self.resubscriber.succeeded()
            return
        log.error("weight stream of %s: the broker at %s refused the subscription to %s (%s)",
                  self.model, self.address, self.topic, refused[0])  # fmt: skip
        if self.failover.several:
            self.resubscriber.refused(self.topic, lambda: client.subscribe(self.topic, qos=1))

    def _on_connect_fail(self, client: paho.Client, userdata: object) -> None:
        self.status.failed()
        self._next_node(client, "nothing answered")

    def _held(self, topic: str, payload: bytes) -> None:
        digits = topic.removeprefix(self.held_prefix)
        held = self.on_held
        if held is None or not topic.startswith(self.held_prefix) or not payload:
            return  # a deleted (released) version: the record no longer names it
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            self.defer(functools.partial(held, int(digits), payload))

    def _next_node(self, client: paho.Client, why: str) -> None:
        self.failover.failed(client, why)  # with several nodes, the next attempt goes to the next
        self.status.address = self.failover.current

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        try:
            if message.topic != self.topic:
                self._held(message.topic, bytes(message.payload))
                return
            self.submit(bytes(message.payload))
        except Exception:
            log.exception("could not enqueue a weights message")
