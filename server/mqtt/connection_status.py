"""Whether an MQTT client is connected, and why not (``ConnectionStatus``).

Owns the failed attempts since the last connection, the broker's refusal with a hint of what
to do about it (``refusal_text``), the back-off of the log lines about them, and the reason
readiness and the dashboard show.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..config.broker_urls import BrokerAddress
from ..config.sections import BrokerSettings

log = logging.getLogger(__name__)
UNREACHABLE_LOG_MAX_S = 60.0  # failed attempts are logged at 0, 1, 2, 4 ... 60, 60 ... s apart


REFUSAL_HINTS = {
    0x84: 'the broker does not speak MQTT 5 (amqtt, NATS); set broker.protocol = "3.1.1"',
    0x86: "check the user and password in broker.url (or LIVEFIT_BROKER__URL)",
    0x87: "check the user and password in broker.url and the broker's ACL",
    0x85: "the broker refuses this client id (broker.client_id)",
}  # fmt: skip


class ConnectionStatus:
    """Whether one client is connected, and why not: its failed attempts since the last
    connection, counted, and logged at the first failure, then 1, 2, 4 ... up to 60 s apart
    (at once again when the failure changes, e.g. from unreachable to refused)."""

    def __init__(
        self, address: BrokerAddress, client_id: str, settings: BrokerSettings, what: str = "",
        nodes: Sequence[BrokerAddress] = (),
    ) -> None:  # fmt: skip
        self.address = address  # the node tried now (failover moves it)
        self.nodes = tuple(nodes)  # a cluster's nodes: named all once every one has failed
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
        text = refusal_text(refusal) if refusal is not None else None
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
                self.what, self.where(), self.client_id, self.failures, attempts, self.retry_s,
            )  # fmt: skip
        else:
            log.error(
                "%sMQTT broker at %s refused the connection for client id %r: %s (%d connection "
                "%s failed); retrying every %d s at most",
                self.what, self.where(), self.client_id, text, self.failures, attempts,
                self.retry_s,
            )  # fmt: skip

    def succeeded(self) -> int:
        """Connected; returns how many attempts had failed before."""
        failed, self.failures, self.refusal, self._gap = self.failures, 0, None, 0.0
        self.connected.set()
        return failed

    def where(self) -> str:
        """The node tried now; with several nodes once as many attempts failed as there are
        nodes (each was tried), every node: one of them alone would send an operator to check
        that one while the count covers them all."""
        if len(self.nodes) > 1 and self.failures >= len(self.nodes):
            return f"every node ({', '.join(str(node) for node in self.nodes)})"
        return str(self.address)

    def reason(self) -> str:
        """Why there is no connection, for readiness and the dashboard."""
        attempts = "attempt" if self.failures == 1 else "attempts"
        if self.refusal is not None:
            return (
                f"MQTT broker at {self.where()} refused the connection: {self.refusal} "
                f"({self.failures} connection {attempts} failed)"
            )
        if self.failures:
            return (
                f"MQTT broker at {self.where()} unreachable "
                f"({self.failures} connection {attempts} failed)"
            )
        return f"not connected to the MQTT broker at {self.address}"


def refusal_text(reason: Any) -> str:
    """paho's reason ("Not authorized") with what to do about it."""
    hint = REFUSAL_HINTS.get(getattr(reason, "value", -1))
    if hint is None and str(reason) in ("Not authorized", "Bad user name or password"):
        hint = REFUSAL_HINTS[0x86]
    return f"{reason}; {hint}" if hint else str(reason)
