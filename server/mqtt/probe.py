"""One-off connection attempts to a broker (``probe``) and what they decide: the protocol every
client of this process speaks with it (``for_broker``: MQTT 3.1.1 where the broker refuses 5;
with a cluster's nodes, the first node that answers decides)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho

from ..config.broker_urls import BrokerAddress, as_nodes
from ..config.sections import BrokerSettings
from .connection_status import refusal_text
from .paho_client import paho_client

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One connection attempt: connected, refused (with the broker's reason), or no answer."""

    connected: bool
    refused: Any = None  # the CONNACK reason code when the broker refused
    error: str = ""  # why nothing answered

    def describe(self) -> str:
        if self.connected:
            return "connected"
        return refusal_text(self.refused) if self.refused is not None else self.error


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
    address: BrokerAddress | Sequence[BrokerAddress],
    settings: BrokerSettings,
    protocol: str | None = None,
) -> BrokerSettings:
    """The broker settings every client of this process uses with the broker at ``address``
    (or a cluster's nodes: the first that answers speaks for all): ``settings`` with
    ``protocol`` (a broker livefit started says what it speaks), or with MQTT 3.1.1 where
    ``settings`` say 5 and the broker refuses 5 as unsupported (amqtt, NATS), with a warning."""
    if protocol is not None or settings.protocol != "5":
        return settings.model_copy(update={"protocol": protocol or settings.protocol})
    timeout_s = min(3.0, settings.connect_timeout_s)
    for node in as_nodes(address):
        first = probe(node, settings, "5", timeout_s=timeout_s)
        if first.connected or first.refused is not None:
            break  # this node answered
    if first.refused is None or getattr(first.refused, "value", None) != 0x84:
        return settings
    if probe(node, settings, "3.1.1", timeout_s=timeout_s).connected:
        log.warning(
            "MQTT broker at %s does not speak MQTT 5 (amqtt, NATS); using MQTT 3.1.1 "
            '(set broker.protocol = "3.1.1" to say so)', node,
        )  # fmt: skip
        return settings.model_copy(update={"protocol": "3.1.1"})
    return settings
