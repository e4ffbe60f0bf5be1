"""Child processes livefit starts die with their parent, even a SIGKILLed one, and only then.

``livefit serve`` with ``broker.url = "auto"`` and nothing on 127.0.0.1:1883 starts mosquitto
through ``runtime.mosquitto.Mosquitto`` (the demo starts its learner, replica and mosquitto
through the same toolkit, on ``children.start_child``, tested in test_demo.py). Port 1883 is
not ours to free in a test, so the parent in the first test is a small process that starts the
broker exactly as ``serve`` does, on a free port, and is then killed with SIGKILL. The last
test gets a free 1883 another way: it runs ``livefit serve`` (split) in a network namespace of
its own, where it must start its broker and train through it (a broker forked by a thread
that then ended was SIGKILLed at once, Linux's parent-death signal following the thread).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from livefit.server.runtime.children import start_child
from livefit.server.runtime.local_process import free_port
from tests.procfs import alive

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("mosquitto") is None,
    reason="PR_SET_PDEATHSIG is Linux's; needs mosquitto",
)
PARENT = """
import sys, time
from pathlib import Path
from livefit.server.runtime.mosquitto import Mosquitto
child = Mosquitto(Path(sys.argv[1]), int(sys.argv[2])).start()
print(child.process.pid, flush=True)
time.sleep(120)
"""


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


def test_a_child_started_by_a_thread_that_ends_lives_on() -> None:
    """The parent-death signal follows the thread that forked the child: ``start_child`` from a
    short-lived thread (the split learner's start thread starts the ``auto`` broker) must not
    fork there, or the child is SIGKILLed when that thread ends."""
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(start_child(["sleep", "30"])))
    thread.start()
    thread.join()
    child = started[0]
    try:
        time.sleep(0.3)  # the kernel signals at once when the forking thread exits
        assert child.poll() is None, f"killed with its forking thread: {child.returncode}"
    finally:
        child.kill()
        child.wait(10)


# Runs in the network namespace: the split learner with broker.url = "auto" (nothing listens on
# 1883 there), samples published to 127.0.0.1:1883, then SIGTERM; prints what it saw as JSON.
IN_NAMESPACE = """
import json, signal, sys, time
from pathlib import Path
from livefit.clients.publish import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess, NotReady
from livefit.server.runtime.local_process import is_listening
from tests.configs import learner_config, model
from tests.layouts import SPLIT, metric

workdir, count = Path(sys.argv[1]), int(sys.argv[2])
seen = {"listening_before": is_listening("127.0.0.1", 1883)}
config = learner_config("auto", workdir / "data", "auto-broker", model(), layout=SPLIT)
learner = LivefitProcess(config, workdir, name="learner")
try:
    learner.start(ready_timeout_s=90)
    stream = LinearStream(input_dim=8, seed=0)
    with SamplePublisher("mqtt://127.0.0.1:1883", "livefit/demo/samples", fmt="msgpack") as out:
        for _ in range(count // 50):
            out.publish(*stream.sample(50), batched=True)
    deadline = time.monotonic() + 60
    while metric(learner, "livefit_train_samples_total", model="demo") < count:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    seen["trained"] = metric(learner, "livefit_train_samples_total", model="demo")
except NotReady as exc:
    seen["not_ready"] = str(exc).splitlines()[0]
finally:
    seen["status"] = learner.stop(signal.SIGTERM, timeout=60)
print(json.dumps(seen), flush=True)
"""


def _namespaces_usable() -> str | None:
    """Why a test cannot run a process in a network namespace of its own; None when it can."""
    if os.geteuid() != 0:
        return "needs root for a network namespace (unshare --net)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "--fork", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    return None if probe.returncode == 0 else f"unshare --net refused: {probe.stderr.strip()}"


def test_serve_starts_its_own_broker_where_none_listens(tmp_path: Path) -> None:
    """``livefit serve`` (split), ``broker.url = "auto"``, a fresh network namespace: it starts
    mosquitto, becomes ready, trains every published sample through that broker and exits 0
    on SIGTERM."""
    reason = _namespaces_usable()
    if reason is not None:
        pytest.skip(reason)
    count = 500
    script = f'ip link set lo up && exec {sys.executable} -c "$0" "$@"'
    done = subprocess.run(
        ["unshare", "--net", "--fork", "sh", "-c", script, IN_NAMESPACE, str(tmp_path), str(count)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    log = (tmp_path / "learner.log").read_text(errors="replace")
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n{log[-3000:]}"
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["listening_before"] is False  # nothing on 1883: the learner must start one
    assert "started mosquitto as a child process" in log
    assert seen.get("not_ready") is None, f"{seen}\n{log[-4000:]}"
    assert seen["trained"] == count and seen["status"] == 0, f"{seen}\n{log[-4000:]}"
    assert "unreachable" not in log, log[-4000:]
