"""Failing over between a broker cluster's nodes: which node to try next (``NodeRotation``, pure
state), the driver that points one paho client at it (``Failover``), and the resend of a
subscription a node refused while the cluster recovers (``Resubscriber``).

paho 2.x reconnects only to the host it was given; with several nodes, a lost connection or a
failed attempt moves the client to the next node in order (round-robin), at once within a
round and after the back-off of ``broker.reconnect_min_s`` .. ``reconnect_max_s`` (doubling)
between full rounds that all failed. The client id, the persistent session's CONNECT flags and
the credentials stay the same: the cluster resumes the session on the node it reaches. With one
node nothing here acts and paho retries that node with its own back-off, as before.

Every call of ``Failover`` but ``start`` and ``metrics`` runs on paho's network thread, inside
its callbacks: it sets the next address and the wait and returns (no I/O, no sleep).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import paho.mqtt.client as paho

from ..base.metrics import Metrics
from ..config.broker_urls import BrokerAddress
from ..config.sections import BrokerSettings
from .metrics import BrokerMetrics

log = logging.getLogger(__name__)


class NodeRotation:
    """Which node to try next: the nodes in order, round after round, starting at the first.
    ``advance`` after each lost connection or failed attempt says the wait before the next:
    0 within a round; after a round of ``len(nodes)`` failures in a row, ``min_s`` doubling up
    to ``max_s`` (whole seconds, at least 1: paho waits in whole seconds)."""

    def __init__(self, nodes: Sequence[BrokerAddress], min_s: float, max_s: float) -> None:
        if not nodes:
            raise ValueError("no broker node")
        self.nodes = tuple(nodes)
        self.index = 0
        self.min_s = max(1, round(min_s))
        self.max_s = max(self.min_s, round(max_s))
        self._failures = 0  # lost connections and failed attempts since the last connection
        self._rounds = 0  # full rounds of failures since the last connection

    @property
    def current(self) -> BrokerAddress:
        return self.nodes[self.index]

    def advance(self) -> int:
        """The node at ``current`` failed: move to the next; returns the seconds to wait."""
        self.index = (self.index + 1) % len(self.nodes)
        self._failures += 1
        if self._failures % len(self.nodes):
            return 0
        wait = min(self.min_s * 2**self._rounds, self.max_s)
        self._rounds = min(self._rounds + 1, 32)  # 2**32 s is beyond any max_s
        return wait

    def connected(self) -> None:
        """``current`` accepted the connection: the next failure starts a new round."""
        self._failures = self._rounds = 0


class Failover:
    """Points one paho client at the node ``NodeRotation`` picks: ``start`` connects to the
    first; the client's owner calls ``attempt_started`` from ``on_pre_connect``, ``failed``
    from ``on_connect_fail`` and ``on_disconnect`` (not for a disconnect it asked for or a
    take-over) and ``connected`` from a successful ``on_connect``, ``disconnected`` from every
    ``on_disconnect`` and after its own disconnect. A node that fails is left
    once per attempt, however many callbacks report it. Each switch is logged (from which node
    to which, and why) and, with ``metrics`` (the learner's sample sessions), counted in
    ``livefit_broker_failovers_total``, with ``livefit_broker_node_connections{node}`` naming
    the node each session is on."""

    def __init__(
        self,
        nodes: Sequence[BrokerAddress],
        settings: BrokerSettings,
        client_id: str,
        metrics: Metrics | None = None,
        what: str = "",
    ) -> None:
        self.rotation = NodeRotation(nodes, settings.reconnect_min_s, settings.reconnect_max_s)
        self.settings = settings
        self.client_id = client_id
        self.what = what  # e.g. "weight stream of demo: "
        self._metrics = metrics.group(BrokerMetrics) if metrics is not None else None
        self._connect_kwargs: dict[str, Any] = {}
        self._attempt_open = False  # an attempt at ``current`` started and not failed yet
        self._on_node: str | None = None  # the node this session is counted on, while connected

    @property
    def current(self) -> BrokerAddress:
        return self.rotation.current

    @property
    def several(self) -> bool:
        return len(self.rotation.nodes) > 1

    def start(self, client: paho.Client, **connect_kwargs: Any) -> None:
        """Connect ``client`` in the background to the first node, with ``connect_kwargs``
        (keepalive, clean_start, properties) at every node."""
        self._connect_kwargs = connect_kwargs
        node = self.current
        client.connect_async(node.host, node.port, **connect_kwargs)

    def attempt_started(self) -> None:
        self._attempt_open = True

    def connected(self, client: paho.Client) -> None:
        """``current`` accepted the session: the back-off is the settings' again."""
        self.rotation.connected()
        if self.several:
            client.reconnect_delay_set(min_delay=self.rotation.min_s, max_delay=self.rotation.max_s)
        if self._metrics is not None:
            self._on_node = self.current.node
            self._metrics.broker_node_connections.labels(node=self._on_node).inc()

    def failed(self, client: paho.Client, why: str) -> None:
        """The connection to ``current`` was lost, or an attempt failed (``why``, for the
        log): the next attempt goes to the next node."""
        if not self.several or not self._attempt_open:
            return
        self._attempt_open = False
        before = self.current
        wait = self.rotation.advance()
        after = self.current
        client.connect_async(after.host, after.port, **self._connect_kwargs)
        client.reconnect_delay_set(min_delay=wait, max_delay=wait)
        if self._metrics is not None:
            self._metrics.broker_failovers.inc()
        log.warning(
            "%sMQTT client %r fails over from broker node %s to %s%s: %s",
            self.what, self.client_id, before.node, after.node,
            f" in {wait} s (every node failed in a row)" if wait else "", why,
        )  # fmt: skip

    def disconnected(self) -> None:
        """The connection ended (whatever the reason): the session no longer counts on its
        node."""
        if self._on_node is not None and self._metrics is not None:
            self._metrics.broker_node_connections.labels(node=self._on_node).dec()
        self._on_node = None


class Resubscriber:
    """Sends a refused SUBSCRIBE again, from a timer thread, after 1 s doubling up to 60 s: a
    cluster node that cannot serve a subscription yet (NATS times out creating its JetStream
    consumer while the cluster elects a leader, and refuses it) can a few seconds later. Only
    one resend waits at a time; ``succeeded`` resets the wait; the owner ``cancel`` s it on
    stop. A resend while disconnected is refused by paho and harmless: every connection
    subscribes again anyway."""

    FIRST_WAIT_S = 1.0
    MAX_WAIT_S = 60.0

    def __init__(self, what: str) -> None:
        self.what = what  # e.g. "weight stream of demo"
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._wait_s = self.FIRST_WAIT_S
        self._stopped = False

    def refused(self, topic: str, resend: Callable[[], object]) -> None:
        """The broker refused the subscription to ``topic``: ``resend`` it after the wait."""
        with self._lock:
            if self._stopped or (self._timer is not None and self._timer.is_alive()):
                return
            wait, self._wait_s = self._wait_s, min(self._wait_s * 2, self.MAX_WAIT_S)
            self._timer = threading.Timer(wait, resend)
            self._timer.name = f"resubscribe-{topic}"
            self._timer.daemon = True
            self._timer.start()
        log.warning("%s: subscribing to %s again in %g s", self.what, topic, wait)

    def succeeded(self) -> None:
        with self._lock:
            self._wait_s = self.FIRST_WAIT_S

    def cancel(self) -> None:
        with self._lock:
            self._stopped = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            timer.join(5.0)
