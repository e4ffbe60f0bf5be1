"""Brokers other than the session mosquitto, for the end-to-end tests: a NATS server with
JetStream and its MQTT gateway (``NatsServer``), the embedded amqtt in a process of its own
(``embedded_amqtt``), and finding ``nats-server`` (``require_nats_server``).

A broker is ready when an MQTT QoS 1 publish comes back to a subscriber, not when its port
listens: NATS keeps MQTT sessions in JetStream, which answers only once it has a meta leader
(/work/shared/notes/brokers.md), so a client connecting earlier can be refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.runtime.local_process import LOOPBACK, LocalProcess, free_port
from livefit.server.runtime.mosquitto import SBIN_DIRS

NATS_APT_HINT = "apt-get install -y nats-server (./dev test installs it)"


def in_ci() -> bool:
    """True on CI (``CI`` set, as CI services and ``.ci/run``'s callers do): there a missing
    tool is a failure of the setup, not a reason to skip."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def find_nats_server() -> str | None:
    """The nats-server executable: on PATH, else in /usr/sbin (Debian) or /usr/local/sbin."""
    return shutil.which("nats-server") or shutil.which(
        "nats-server", path=os.pathsep.join(SBIN_DIRS)
    )


def require_nats_server() -> str:
    """The nats-server executable; where it is missing the test is skipped, saying how to
    install it, except on CI, where it fails (``./dev test`` installs it there)."""
    found = find_nats_server()
    if found is not None:
        return found
    message = f"nats-server is not installed: {NATS_APT_HINT}"
    if in_ci():
        pytest.fail(f"{message}; on CI it must be there (CI is set)")
    pytest.skip(message)


def mqtt_round_trip(host: str, port: int, timeout: float = 5.0) -> bool:
    """True when an MQTT 3.1.1 QoS 1 message published to ``host:port`` reaches a
    subscriber on the same connection within ``timeout``; False on any refusal or silence."""
    received = threading.Event()
    topic = f"livefit-probe/{os.getpid()}/{time.monotonic_ns()}"
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=f"probe-{time.monotonic_ns()}",
        protocol=paho.MQTTv311,
    )  # fmt: skip
    client.on_message = lambda _c, _u, message: received.set()
    try:
        client.connect(host, port, keepalive=10)
        client.loop_start()
        deadline = time.monotonic() + timeout
        while not client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.02)
        client.subscribe(topic, qos=1)
        time.sleep(0.1)  # the subscription is in place before the publish
        client.publish(topic, b"probe", qos=1)
        return received.wait(max(0.0, deadline - time.monotonic()))
    except OSError:
        return False
    finally:
        client.disconnect()
        client.loop_stop()


def wait_mqtt_round_trip(
    host: str, port: int, alive: Callable[[], bool], what: str, timeout: float = 60.0
) -> float:
    """Seconds until ``mqtt_round_trip`` succeeds; RuntimeError when ``alive()`` turns False
    first or ``timeout`` passes."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not alive():
            raise RuntimeError(f"{what} exited before answering MQTT on {host}:{port}")
        if mqtt_round_trip(host, port, timeout=min(5.0, timeout)):
            return time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"{what} gave no MQTT QoS 1 round trip on {host}:{port} in {timeout:.0f}s")


class NatsServer(LocalProcess):
    """One nats-server on free loopback ports with JetStream (its store in ``workdir``) and the
    MQTT gateway, which speaks MQTT 3.1.1 only (``protocol``); ``url`` is the MQTT listener.

    ``max_payload`` is NATS' message limit for its own clients (1 MB by default); 2.9.10's MQTT
    gateway does not apply it to MQTT publishes (measured: 20 MB went through with 64KB), a
    version that does would refuse a larger weight snapshot. ``extra_config``: lines at the top level of the config (a ``cluster { ... }``
    block for a node of a cluster); ``mqtt_config``: lines inside its ``mqtt { }`` block
    (``stream_replicas: 3``, ``max_ack_pending: 2000``). ``start`` returns once a QoS 1 round
    trip works; ``stop`` sends SIGTERM and kills after ``stop_timeout_s``. A context manager:
    ``with NatsServer(dir) as nats:`` starts it and stops it.
    """

    kind = "nats"
    protocol = "3.1.1"
    stop_timeout_s = 15.0

    def __init__(
        self, workdir: Path, *, server_name: str = "livefit-test", max_payload: str = "8MB",
        extra_config: str = "", mqtt_config: str = "", host: str = LOOPBACK,
    ) -> None:  # fmt: skip
        executable = require_nats_server()
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.host, self.server_name = workdir, host, server_name
        self.client_port, self.port = free_port(host), free_port(host)
        self.max_payload = max_payload
        self.extra_config, self.mqtt_config = extra_config, mqtt_config
        self.conf = workdir / "nats.conf"
        self.ready_s: float | None = None  # how long the last start took to a round trip
        super().__init__("nats-server", [executable, "-c", str(self.conf)], workdir / "nats.log")

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config_text(self) -> str:
        mqtt_lines = "".join(f"  {line}\n" for line in self.mqtt_config.splitlines() if line)
        return (
            f"server_name: {self.server_name}\nlisten: {self.host}:{self.client_port}\n"
            f"max_payload: {self.max_payload}\n"
            f'jetstream {{\n  store_dir: "{self.workdir / "jetstream"}"\n}}\n'
            f"mqtt {{\n  listen: {self.host}:{self.port}\n{mqtt_lines}}}\n{self.extra_config}\n"
        )

    def start(self, timeout: float = 60.0) -> Self:
        """Write the config, start, and return once an MQTT QoS 1 round trip works;
        RuntimeError with the log's end (the process killed) when it does not."""
        self.conf.write_text(self.config_text())
        super().start()
        try:
            self.ready_s = wait_mqtt_round_trip(self.host, self.port, self.alive, "nats-server",
                                                timeout)  # fmt: skip
        except RuntimeError as exc:
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"{exc}:\n{self.tail()}") from None
        return self

    def __enter__(self) -> Self:
        return self if self.alive() else self.start()


@contextlib.contextmanager
def embedded_amqtt() -> Iterator[str]:
    """An embedded amqtt (MQTT 3.1.1 only, ``runtime.broker.EmbeddedAmqtt``) on a free port in a
    process of its own, killed on the way out: its URL. Skips where amqtt is not installed."""
    pytest.importorskip("amqtt")
    port = free_port()
    code = (
        "import sys, time\nfrom livefit.server.runtime.broker import EmbeddedAmqtt\n"
        f"EmbeddedAmqtt(port={port})\nprint('ready', flush=True)\ntime.sleep(3600)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", code], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        assert process.stdout.readline().strip() == "ready"
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()
