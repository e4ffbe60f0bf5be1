"""Resolve ``broker.url = "auto"``: find a broker or start one (a URL is parsed by
``config.broker_urls``).

``auto`` picks, in order, and says in the log which it chose:
1. a broker already listening on 127.0.0.1:1883 (Debian's mosquitto package starts one);
2. mosquitto started as a child process, when the binary is on PATH (persistence on, under
   ``storage.dir``/mosquitto);
3. an embedded amqtt broker (``pip install livefit[embedded-broker]``), with a loud warning: it
   speaks MQTT 3.1.1 only and does not redeliver unacknowledged messages, so no-loss
   guarantees do not hold on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Protocol

from ..config.broker_urls import DEFAULT_HOST, DEFAULT_PORT, BrokerAddress, parse_broker_urls
from .local_process import is_listening
from .mosquitto import Mosquitto, find_mosquitto

log = logging.getLogger(__name__)


class ManagedBroker(Protocol):
    """A broker livefit started itself and must stop on shutdown (``runtime.mosquitto.Mosquitto``
    or ``EmbeddedAmqtt``)."""

    kind: str
    protocol: str

    def stop(self) -> object: ...


class EmbeddedAmqtt:
    """amqtt running on its own event loop in a daemon thread (MQTT 3.1.1, no redelivery)."""

    kind = "amqtt"
    protocol = "3.1.1"

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        try:
            from amqtt.broker import Broker
        except ImportError:
            raise RuntimeError(
                "no MQTT broker: nothing listens on 127.0.0.1:1883, mosquitto is not on PATH "
                "(apt-get install mosquitto) and amqtt is not installed "
                "(pip install 'livefit[embedded-broker]'); or set broker.url"
            ) from None
        self.port = port
        # amqtt warns about its own defaults (no password file, no $SYS interval) and about
        # every connection that sends no MQTT or MQTT 5 (our readiness and protocol probes):
        # noise on a new user's console. Its errors still show.
        logging.getLogger("amqtt").setLevel(logging.ERROR)
        logging.getLogger("amqtt.broker").addFilter(_not_a_probe)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
            "sys_interval": 0,
            "auth": {"allow-anonymous": True},
            "topic-check": {"enabled": False},
        }
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="amqtt", daemon=True)
        self._thread.start()

        async def create() -> Broker:  # amqtt looks up the running loop when it is built
            return Broker(config)

        self._broker = asyncio.run_coroutine_threadsafe(create(), self._loop).result(timeout=15)
        asyncio.run_coroutine_threadsafe(self._broker.start(), self._loop).result(timeout=15)
        # start() returned: it listens (a TCP probe here would only make amqtt log an error)

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


def _not_a_probe(record: logging.LogRecord) -> bool:
    """False for amqtt's error about a connection that sent nothing (a TCP readiness probe:
    ``is_listening``, a health checker)."""
    return not str(record.msg).startswith("No data from")


def resolve_broker(
    url: str | list[str],
    storage_dir: Path,
    allow: tuple[str, ...] = ("existing", "mosquitto", "amqtt"),
) -> tuple[tuple[BrokerAddress, ...], ManagedBroker | None]:
    """The broker nodes to connect to (one, or a cluster's in the order ``url`` lists them),
    starting a broker when ``url`` is ``auto`` and none is running."""
    if url != "auto":
        return parse_broker_urls(url), None
    address, managed = _auto_broker(storage_dir, allow)
    return (address,), managed


def _auto_broker(
    storage_dir: Path, allow: tuple[str, ...]
) -> tuple[BrokerAddress, ManagedBroker | None]:
    address = BrokerAddress(DEFAULT_HOST, DEFAULT_PORT)
    if "existing" in allow and is_listening(address.host, address.port):
        log.info("broker: using the broker already listening on %s", address)
        return address, None
    if "mosquitto" in allow and find_mosquitto():
        mosquitto = Mosquitto(storage_dir / "mosquitto", address.port, host=address.host)
        managed: ManagedBroker = mosquitto.start()
        log.info("broker: started mosquitto as a child process on %s (persistence on)", address)
        return address, managed
    if "amqtt" in allow:
        managed = EmbeddedAmqtt(port=address.port)
        log.warning(
            "broker: started an EMBEDDED amqtt broker on %s. It speaks MQTT 3.1.1 only and does "
            "NOT redeliver unacknowledged messages: samples can be lost. Install mosquitto "
            "for anything beyond a demo.",
            address,
        )
        return address, managed
    raise RuntimeError("broker.url is auto but no broker could be found or started")
