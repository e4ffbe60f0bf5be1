"""The brokers end-to-end tests start: a mosquitto per session or per test, an embedded amqtt.

Only tests under ``tests/e2e/`` can ask for them: a unit test starts no broker and no process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto


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
    pytest.importorskip("amqtt")
    port = free_port()
    code = (
        "import sys, time\nfrom livefit.server.runtime.broker import EmbeddedAmqtt\n"
        f"EmbeddedAmqtt(port={port})\nprint('ready', flush=True)\ntime.sleep(600)\n"
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
