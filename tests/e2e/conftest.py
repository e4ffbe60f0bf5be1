"""The brokers end-to-end tests start: a mosquitto per session or per test, an embedded amqtt
(``tests/brokers.py`` starts it, and NATS).

Only tests under ``tests/e2e/`` can ask for them: a unit test starts no broker and no process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.server.runtime.mosquitto import Mosquitto
from tests.brokers import embedded_amqtt


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A mosquitto on a free port for the whole session (never the one at 1883)."""
    instance = Mosquitto(tmp_path_factory.mktemp("mosquitto"))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A mosquitto for one test, which that test may stop, kill and restart."""
    instance = Mosquitto(tmp_path / "mosquitto")
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def amqtt_broker() -> Iterator[str]:
    """An embedded amqtt (MQTT 3.1.1 only) on a free port, in a process of its own: its URL."""
    with embedded_amqtt() as url:
        yield url
