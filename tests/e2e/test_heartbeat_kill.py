"""A worker group's liveness check on real processes (``WorkerGroup._kill_if_silent``): the
parent kills a process that served and then went silent past the timeout, and no other (not
one still starting, none while the check is off). The event loop's beat itself:
``tests/unit/base/test_heartbeat.py``; the whole case (SIGSTOP of a split learner's serving
process, killed and started again): ``test_learner_group.py``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.server.runtime.workers import GroupMember, WorkerGroup


@pytest.fixture
def group(tmp_path: Path) -> Iterator[WorkerGroup]:
    sock = socket.socket()
    group = WorkerGroup([sys.executable, "-c", "import time; time.sleep(60)"], 2, sock,
                        hang_timeout_s=5.0)  # fmt: skip
    try:
        yield group
    finally:
        for worker in group.workers:
            if worker.process is not None:
                worker.process.kill()
                worker.process.wait()
        sock.close()


def _running(group: WorkerGroup, index: int, *, served: bool, beats: bool) -> GroupMember:
    worker = group.workers[index]
    worker.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker.served = served
    if beats:
        worker.slot.heartbeat_file().touch()
    return worker


def _check(group: WorkerGroup, worker: GroupMember, now: float) -> None:
    group._kill_if_silent(worker, worker.slot.heartbeat_file(), f"worker {worker.slot.index}", now)


def test_only_a_served_worker_silent_past_the_timeout_is_killed(group: WorkerGroup) -> None:
    silent = _running(group, 0, served=True, beats=True)
    beating_worker = _running(group, 1, served=True, beats=True)
    for worker in (silent, beating_worker):
        _check(group, worker, now=100.0)  # first sight of each beat
    time.sleep(0.05)
    beating_worker.slot.heartbeat_file().touch()  # it beats; the other does not
    for worker in (silent, beating_worker):
        _check(group, worker, now=106.0)  # 6 s later: past the 5 s timeout
    assert silent.process is not None and silent.process.wait(10) == -9
    assert beating_worker.process is not None and beating_worker.process.poll() is None


def test_a_starting_worker_or_a_check_turned_off_kills_nothing(group: WorkerGroup) -> None:
    starting = _running(group, 0, served=False, beats=True)  # not served yet: still loading
    no_beat_yet = _running(group, 1, served=True, beats=False)
    for now in (100.0, 160.0):
        _check(group, starting, now=now)
        _check(group, no_beat_yet, now=now)
    group.hang_timeout_s = 0.0  # http.worker_timeout_s = 0
    starting.served = True  # served and silent for a minute, but the check is off
    _check(group, starting, now=220.0)
    time.sleep(0.2)
    assert starting.process is not None and starting.process.poll() is None
    assert no_beat_yet.process is not None and no_beat_yet.process.poll() is None
