"""Which broker the demo uses (one given, one already on 127.0.0.1:1883, or one it starts:
mosquitto, else an embedded amqtt), checked by connecting once as the learner will; and, on a
broker it did not start, deleting the retained weights its learner left there:
``choose_broker`` and ``clear_retained``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from livefit.server.runtime.broker import ManagedBroker
from livefit.server.runtime.local_process import free_port, is_listening
from livefit.server.runtime.mosquitto import Mosquitto, find_mosquitto

from .demo_stop import StopRequest


@dataclass(frozen=True)
class DemoBroker:
    """The broker the demo uses: its URL, the MQTT version to speak to it, and the broker the
    demo started (to stop at the end), or None for one it found running."""

    url: str
    protocol: str
    managed: ManagedBroker | None


def choose_broker(
    url: str, workdir: Path, stop: StopRequest, console: Console
) -> DemoBroker | None:
    """The broker to use for ``--broker`` ``url`` (started in ``workdir`` and registered in
    ``stop.children`` if the demo starts one); None (and why said) if there is none to use."""
    from livefit.server.config.broker_urls import (
        DEFAULT_HOST,
        DEFAULT_PORT,
        BrokerAddress,
        parse_broker_url,
    )
    from livefit.server.runtime.broker import EmbeddedAmqtt

    if url != "auto":
        try:
            address = parse_broker_url(url)
        except ValueError as exc:
            console.print(f"[red]--broker: {exc}[/red]")
            return None
        if not is_listening(address.host, address.port, timeout=2.0):
            console.print(
                f"[red]nothing listens at {address.host}:{address.port} ({address}): start "
                "the broker, or use --broker auto to let the demo start one[/red]"
            )
            return None
        return _connect_once(url, address, "given", console)
    if is_listening(DEFAULT_HOST, DEFAULT_PORT):
        address = BrokerAddress(DEFAULT_HOST, DEFAULT_PORT)
        return _connect_once(str(address), address, "already running; the demo uses its own "
                             "topics", console)  # fmt: skip
    if find_mosquitto():
        child = Mosquitto(workdir / "mosquitto", persistence=False)
        stop.children.append(child)
        child.start()
        console.print(f"[bold]broker[/bold] {child.url} (mosquitto started for the demo)")
        return DemoBroker(child.url, child.protocol, child)
    try:
        embedded = EmbeddedAmqtt(port=free_port())
    except RuntimeError as exc:  # amqtt is not installed: say what to install
        console.print(f"[red]{exc}[/red]")
        return None
    address = BrokerAddress(DEFAULT_HOST, embedded.port)
    console.print(f"[bold]broker[/bold] {address} (embedded amqtt: MQTT 3.1.1, may lose samples)")
    return DemoBroker(str(address), embedded.protocol, embedded)


def _connect_once(url: str, address: Any, how: str, console: Console) -> DemoBroker | None:
    """Connect to a broker the demo did not start, as its learner will: MQTT 5, or 3.1.1
    where the broker does not speak 5; None (and the broker's reason said) if it refuses."""
    from livefit.server.config.sections import BrokerSettings
    from livefit.server.mqtt.probe import probe

    settings, protocol = BrokerSettings(), "5"
    result = probe(address, settings, protocol)
    if getattr(result.refused, "value", None) == 0x84:  # unsupported protocol version
        protocol = "3.1.1"
        result = probe(address, settings, protocol)
    if not result.connected:
        console.print(f"[red]broker {address} ({how}): cannot connect: {result.describe()}[/red]")
        return None
    speaks = "" if protocol == "5" else "; MQTT 3.1.1 only"
    console.print(f"[bold]broker[/bold] {address} ({how}{speaks})")  # no password shown
    return DemoBroker(url, protocol, None)


def clear_retained(broker: str, topic: str) -> None:
    """Delete the retained weights the demo's learner left on a broker the demo did not start
    (an empty retained message deletes it), so the user's broker keeps nothing of the demo."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from livefit.server.config.broker_urls import parse_broker_url

    address = parse_broker_url(broker)
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    if address.username is not None:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        client.tls_set()
    try:
        client.connect(address.host, address.port, keepalive=10)
        client.loop_start()
        client.publish(topic, b"", qos=1, retain=True).wait_for_publish(3)
    except (OSError, ValueError, RuntimeError):
        pass  # best effort: the broker may be gone
    finally:
        client.disconnect()
        client.loop_stop()
