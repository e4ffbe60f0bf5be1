"""A split learner's processes forked from its fork server (``processes.preload``, the default;
``server/runtime/fork_server.py``), through the real processes: who is whose child and named
what, a launch asked by another process than the parent (refused, logged in the group's JSON
logging), a SIGKILLed fork server (every child dies with it; the group starts a new fork server and
its processes, and no acknowledged sample is lost), a SIGKILLed parent (nothing outlives it).
A hangup reaching the fork server (held blocked) is in ``test_learner_group.py``'s SIGHUP test, the
group without a fork server in its SIGTERM test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.fork_server import (
    FORK_SERVER_NAME,
    UNREAPED_GRACE_S,
    ForkedChild,
)
from livefit.server.runtime.local_process import quiet_env
from livefit.server.runtime.mosquitto import Mosquitto
from tests.e2e.test_learner_group import (
    _ready_problems,
    _wait,
    broker,  # noqa: F401  (the module's broker fixture)
    split_config,
    wait_both_serve,
    wait_lineage,
)
from tests.e2e.test_replica_workers import predict_on_new_connections
from tests.e2e.test_weight_stream import publish_samples
from tests.procfs import alive, children, process_name

ROLES = ["livefit-train", "livefit-w0", "livefit-w1"]


def fork_server_of(learner: LivefitProcess) -> int | None:
    assert learner.process is not None
    found = [pid for pid in children(learner.process.pid) if process_name(pid) == FORK_SERVER_NAME]
    return found[0] if found else None


def forked_roles(fork_server: int) -> list[str]:
    return sorted(process_name(pid) for pid in children(fork_server))


def refused_launch(fork_server: int) -> bytes:
    """What the fork server ``fork_server`` answers this process's launch request (a pid and
    a newline if it forked one)."""
    # python -m livefit.server.runtime.fork_server SOCKET --log-level NUMBER [--log-json]
    path = Path(f"/proc/{fork_server}/cmdline").read_bytes().split(b"\0")[3].decode()
    request = {"args": ["--version"], "env": dict(os.environ), "cwd": "/"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(path)
        try:
            connection.sendall(json.dumps(request).encode() + b"\n")
            return connection.recv(64)
        except (BrokenPipeError, ConnectionResetError):  # closed before it read the request
            return b""


def test_the_fork_server_forks_every_process_and_a_killed_one_takes_them_along(
    broker: Mosquitto,  # noqa: F811
    tmp_path: Path,
) -> None:
    # JSON logging, which the group's parent passes on to its fork server
    text = split_config(broker, tmp_path / "data") + "\n[logging]\njson_format = true\n"
    with LivefitProcess(text, tmp_path).start() as learner:
        assert learner.process is not None
        first = fork_server_of(learner)
        assert first is not None and children(learner.process.pid) == [first]
        _wait(lambda: forked_roles(first) == ROLES, timeout=30)
        publish_samples(broker, 1000)
        wait_lineage(learner, 1000)
        wait_both_serve(learner)
        forked = children(first)

        # anyone but the parent asking the fork server for a process (the same user, which
        # alone can reach its 0700 directory): refused, nothing forked
        assert refused_launch(first) == b""
        assert children(first) == forked
        _wait(lambda: "a launch refused" in learner.log.read_text(), timeout=10)
        refusal = next(
            json.loads(line) for line in learner.log.read_text().splitlines()
            if "a launch refused" in line
        )  # fmt: skip
        assert refusal["level"] == "WARNING" and refusal["logger"].endswith("fork_server")

        # a stop sent to the fork server alone (systemd's stop reaches every process): held
        # blocked in every one of its threads (TensorFlow's own included), so it stays up and
        # its children with it, until the parent stops the group
        for stop in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            os.kill(first, stop)
        time.sleep(1.0)
        assert alive(first) and children(first) == forked
        assert predict_on_new_connections(learner, 4) == [200] * 4

        # the fork server SIGKILLed: its children die with it (the parent-death signal), the
        # group starts a new fork server and every process again; samples published meanwhile
        # are trained, each once
        os.kill(first, signal.SIGKILL)
        _wait(lambda: not any(alive(pid) for pid in [first, *forked]), timeout=10)
        publish_samples(broker, 1000, seed=1)
        _wait(lambda: fork_server_of(learner) not in (None, first), timeout=30)
        second = fork_server_of(learner)
        assert second is not None
        _wait(lambda: forked_roles(second) == ROLES, timeout=60)
        wait_lineage(learner, 2000)
        _wait(lambda: _ready_problems(learner) == [], timeout=60)
        wait_both_serve(learner, timeout=60)
        assert predict_on_new_connections(learner, 6) == [200] * 6
        log = learner.log.read_text()
        assert log.count("fork server started (pid ") == 2, log[-3000:]
        assert "the training process exited with status -9; starting it again" in log

        # the parent SIGKILLed: the fork server dies with it, and every process with that
        survivors = [second, *children(second)]
        assert learner.stop(signal.SIGKILL, timeout=30) == -signal.SIGKILL
        _wait(lambda: not any(alive(pid) for pid in survivors), timeout=10)


PRELOAD_THEN_REPORT = """
from livefit.server.runtime.fork_server import preload
preload()
from tensorflow.python.eager import context
print(context.context()._initialized)
"""


def test_preloading_starts_no_tensorflow_runtime() -> None:
    """What the fork server imports must not start TensorFlow's runtime (a module running an
    op when imported): its pools' threads would be missing in every child, and a fork after
    CUDA started is unusable. A fresh process, as the fork server is."""
    done = subprocess.run([sys.executable, "-c", PRELOAD_THEN_REPORT], capture_output=True,
                          text=True, timeout=120, env=quiet_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False", done.stdout


def test_a_child_its_fork_server_does_not_reap_is_seen_to_exit() -> None:
    """A stopped fork server reaps nobody and sends no status: a child of it that exited is
    read from ``/proc`` once unreaped for ``UNREAPED_GRACE_S``, with its exit status, so that
    the group restarts it. Here this process is the non-reaping parent."""
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    ours, theirs = socket.socketpair()
    child = ForkedChild(pid, ours, ["python", "-m", "livefit"])
    try:
        started = time.monotonic()
        while child.poll() is None:
            assert time.monotonic() - started < UNREAPED_GRACE_S + 5, "never seen to exit"
            time.sleep(0.05)
        assert child.returncode == 3
        assert time.monotonic() - started >= UNREAPED_GRACE_S * 0.9  # not at first sight
    finally:
        os.waitpid(pid, 0)
        theirs.close()


def test_a_stop_sent_to_a_fork_server_is_held_by_every_thread_of_it(tmp_path: Path) -> None:
    """The fork server blocks the stop signals before it imports anything: TensorFlow's import
    starts a native thread of its own, which took a SIGTERM sent to the process and ended it
    (its default action), and with it every child (seen: the stop arrived, the process died)."""
    path = tmp_path / "fork.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "livefit.server.runtime.fork_server", str(path)],
        env=quiet_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait(path.exists, timeout=120)
        held = 1 << (signal.SIGHUP - 1) | 1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)
        for status in Path(f"/proc/{server.pid}/task").glob("*/status"):
            blocked = next(
                int(line.split()[1], 16) for line in status.read_text().splitlines()
                if line.startswith("SigBlk:")
            )  # fmt: skip
            assert blocked & held == held, (status, hex(blocked))
        for stop in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            os.kill(server.pid, stop)
        time.sleep(1.0)
        assert server.poll() is None
    finally:
        server.kill()
        server.wait(10)
