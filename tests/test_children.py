"""Child processes livefit starts die with their parent, even a SIGKILLed one.

``livefit serve`` with ``broker.url = "auto"`` and nothing on 127.0.0.1:1883 starts mosquitto
through ``local_processes.Mosquitto`` (the demo starts its learner, replica and mosquitto
through the same toolkit, on ``children.start_child``, tested in test_demo.py). Port 1883 is not ours to free in a test, so
the parent here is a small process that starts the broker exactly as ``serve`` does, on a free
port, and is then killed with SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from livefit.server.processes.local_processes import free_port

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("mosquitto") is None,
    reason="PR_SET_PDEATHSIG is Linux's; needs mosquitto",
)
PARENT = """
import sys, time
from pathlib import Path
from livefit.server.processes.local_processes import Mosquitto
child = Mosquitto(Path(sys.argv[1]), int(sys.argv[2])).start()
print(child.process.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_started_mosquitto_dies_with_its_parent(tmp_path: Path, sig: int) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "mosquitto"), str(free_port())],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    try:
        assert alive(pid)
        assert os.getpgid(pid) == pid  # its own group: the terminal's Ctrl-C is the parent's
        parent.send_signal(sig)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), "mosquitto outlived its parent"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait(10)
        parent.stdout.close()
