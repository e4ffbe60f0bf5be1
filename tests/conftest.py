"""Shared fixtures: a real mosquitto per session, and a check that no test leaves threads behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from livefit.server.runtime.local_process import free_port
from livefit.server.runtime.mosquitto import Mosquitto

# A test's split-layout run (``tests/layouts.py``): its id carries ``split`` among its params.
SPLIT_RUN = re.compile(r"\[(?:[^\]]*-)?split(?:-[^\]]*)?\]$")


class FilesAndLayouts(LoadFileScheduling):
    """``--dist loadfile`` (a file's tests on one worker, so its module fixtures start once),
    but a file's split-layout tests form a unit of their own: the two layouts of a test file
    run on both workers at once."""

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return f"{scope}[split]" if SPLIT_RUN.search(nodeid) else scope


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    return FilesAndLayouts(config, log) if config.getvalue("dist") == "loadfile" else None


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


# Threads that libraries (and ``children.start_child``'s spawner) start once per process and
# keep by design.
_BENIGN_THREAD_PREFIXES = ("asyncio_", "ThreadPoolExecutor", "pytest_timeout", "livefit-spawner")


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread of ours running (Home Assistant's verify_cleanup)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.name.startswith(_BENIGN_THREAD_PREFIXES)
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"
