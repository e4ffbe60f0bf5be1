"""SIGHUP stops a livefit process as SIGTERM does, unless the process started with it ignored
(``nohup``): then it stays ignored (``server/runtime/stop_signals.py``). The whole split
learner under SIGHUP is attacked in test_learner_group.py; here, a real process under each
start condition installs the stop handlers as every livefit process does and is sent SIGHUP.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")

# Installs the stop handlers, sends itself SIGHUP, and says what happened.
HANGS_UP = """
import os, signal, time
from livefit.server.runtime.stop_signals import on_stop_signals
heard = []
on_stop_signals(lambda signum, frame: heard.append(signal.Signals(signum).name))
os.kill(os.getpid(), signal.SIGHUP)
time.sleep(0.2)
print("stopping on " + heard[0] if heard else "still running", flush=True)
"""


@pytest.mark.parametrize(
    ("ignored", "said"), [(False, "stopping on SIGHUP"), (True, "still running")]
)
def test_sighup_is_a_graceful_stop_unless_started_ignored(ignored: bool, said: str) -> None:
    """The child's disposition is set for the case, not inherited: a test run started with
    ``nohup`` ignores SIGHUP, and its children with it."""

    def disposition() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignored else signal.SIG_DFL)

    done = subprocess.run(
        [sys.executable, "-c", HANGS_UP], capture_output=True, text=True, timeout=60,
        preexec_fn=disposition,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == said
