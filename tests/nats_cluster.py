"""A 3-node NATS cluster with JetStream and its MQTT gateway on loopback, for the broker
failover tests (``NatsCluster``): each node a ``nats-server`` child process on free ports,
``stream_replicas: 3`` so that a persistent MQTT session and its unacknowledged messages
survive the loss of any one node.

``start`` returns once every node answers a QoS 1 publish/subscribe round trip (JetStream
needs a meta leader before MQTT sessions work: about 9 s on 2 cores); ``stop`` SIGKILLs every
node still running (the nodes keep nothing the tests need), and the class is a context manager.
NATS's MQTT gateway speaks MQTT 3.1.1 only.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Self

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.runtime.local_process import LOOPBACK, LocalProcess, free_port, wait_listening

NATS_SERVER_PATHS = ("/usr/sbin/nats-server", "/usr/local/bin/nats-server", "/usr/bin/nats-server")


def find_nats_server() -> str | None:
    """The nats-server binary (Debian installs it in /usr/sbin), or None."""
    found = shutil.which("nats-server")
    if found:
        return found
    return next((p for p in NATS_SERVER_PATHS if Path(p).is_file()), None)


class NatsNode(LocalProcess):
    """One node of the cluster: its client, route and MQTT ports, its JetStream directory."""

    def __init__(self, executable: str, workdir: Path, index: int, routes: list[int]) -> None:
        self.index = index
        self.client_port, self.mqtt_port = free_port(), free_port()
        self.route_port = routes[index]
        self.conf = workdir / f"n{index}.conf"
        others = ", ".join(f"nats://{LOOPBACK}:{p}" for i, p in enumerate(routes) if i != index)
        self.conf.write_text(
            f"server_name: n{index}\n"
            f"listen: {LOOPBACK}:{self.client_port}\n"
            "max_payload: 8MB\n"
            f'jetstream {{ store_dir: "{workdir / f"js{index}"}" }}\n'
            f"cluster {{ name: livefit-test, listen: {LOOPBACK}:{self.route_port}, "
            f"routes: [{others}] }}\n"
            f"mqtt {{ listen: {LOOPBACK}:{self.mqtt_port}, stream_replicas: 3 }}\n"
        )
        argv = [executable, "-c", str(self.conf)]
        super().__init__(f"nats-n{index}", argv, workdir / f"n{index}.log")

    @property
    def url(self) -> str:
        return f"mqtt://{LOOPBACK}:{self.mqtt_port}"

    @property
    def node(self) -> str:
        """``host:port`` as livefit names a broker node (``livefit_broker_node_connections``)."""
        return f"{LOOPBACK}:{self.mqtt_port}"


class NatsCluster:
    """``size`` NATS nodes routed to each other, each with JetStream and an MQTT listener."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        executable = find_nats_server()
        if executable is None:
            raise RuntimeError("nats-server is not installed (apt-get install nats-server)")
        workdir.mkdir(parents=True, exist_ok=True)
        routes = [free_port() for _ in range(size)]
        self.nodes = [NatsNode(executable, workdir, i, routes) for i in range(size)]

    @property
    def urls(self) -> list[str]:
        """Every node's MQTT URL, in node order."""
        return [node.url for node in self.nodes]

    def node(self, name: str) -> NatsNode:
        """The node named ``host:port`` (as livefit's metrics name it)."""
        return next(node for node in self.nodes if node.node == name)

    def start(self, timeout_s: float = 90.0) -> Self:
        """Start every node and return once each answers a QoS 1 round trip."""
        try:
            for node in self.nodes:
                node.start()
            deadline = time.monotonic() + timeout_s
            for node in self.nodes:
                wait_listening(
                    LOOPBACK, node.mqtt_port, node.alive, node.name,
                    max(1.0, deadline - time.monotonic()),
                )  # fmt: skip
            for node in self.nodes:
                self._wait_round_trip(node, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL every node still running."""
        for node in self.nodes:
            if node.alive():
                node.stop(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _wait_round_trip(self, node: NatsNode, deadline: float) -> None:
        """Until ``node`` carries a QoS 1 message from a publisher to a subscriber."""
        last = "no attempt"
        while time.monotonic() < deadline:
            for other in self.nodes:
                other.fail_if_exited()
            try:
                if round_trip(node.mqtt_port, timeout_s=5.0):
                    return
                last = "no message within 5 s"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise RuntimeError(f"NATS node n{node.index} carried no QoS 1 message: {last}")


def round_trip(port: int, timeout_s: float) -> bool:
    """Subscribe and publish one QoS 1 message through the MQTT listener on ``port``."""
    topic = f"livefit-test/round-trip/{port}"
    received = threading.Event()
    subscribed = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = lambda *_: received.set()
    client.connect(LOOPBACK, port, keepalive=10)
    client.loop_start()
    try:
        deadline = time.monotonic() + timeout_s
        while not client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        client.subscribe(topic, qos=1)
        if not subscribed.wait(max(0.0, deadline - time.monotonic())):
            return False
        client.publish(topic, b"ping", qos=1)
        return received.wait(max(0.0, deadline - time.monotonic()))
    finally:
        client.disconnect()
        client.loop_stop()
