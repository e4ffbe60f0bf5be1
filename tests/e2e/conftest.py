"""The brokers end-to-end tests start: a mosquitto per session or per test, an embedded amqtt
(``tests/brokers.py`` starts it, and NATS); and how their livefit servers start: forked from a
preloaded interpreter (``tests/forkserver.py``), fresh within ``forkserver.fresh_starts()``
or with ``LIVEFIT_TEST_FRESH_PROCESSES=1``.

Only tests under ``tests/e2e/`` can ask for them: a unit test starts no broker and no process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.server.runtime.mosquitto import Mosquitto
from tests import forkserver
from tests.brokers import embedded_amqtt


@pytest.fixture(scope="session", autouse=True)
def preloaded_starts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """livefit servers forked from this worker's fork server (started at the first one)."""
    if os.environ.get(forkserver.FRESH_ENV) == "1":
        yield
        return
    forkserver.use_fork_server(tmp_path_factory.mktemp("forkserver"))
    yield
    forkserver.stop_fork_server()


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
