"""A worker group's liveness check (``server/heartbeat.py``, ``WorkerGroup._kill_if_silent``):
a serving process's event loop beats; the parent kills a process that served and then went
silent past the timeout, and no other. The end-to-end case (SIGSTOP of a split learner's
serving process, killed and started again) is ``test_learner_group.py``'s."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.server.heartbeat import beating, silent_for
from livefit.server.processes.workers import GroupMember, WorkerGroup


def test_the_event_loop_beats_while_inside_and_stops_after(tmp_path: Path) -> None:
    path = tmp_path / "0.alive"

    async def serve_a_while() -> float | None:
        async with beating(path):
            await asyncio.sleep(0.05)
            assert path.exists()
            os.utime(path, (time.time() - 100, time.time() - 100))
            await asyncio.sleep(1.2)  # the next beat (every second) refreshes it
            return silent_for(path)

    assert (asyncio.run(serve_a_while()) or 100) < 1.0
    assert silent_for(path) is not None
    assert silent_for(tmp_path / "absent") is None
    assert silent_for(path, now=time.time() + 50) == pytest.approx(50, abs=2)


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


def _running(
    group: WorkerGroup, index: int, *, served: bool, silent_s: float | None
) -> GroupMember:
    worker = group.workers[index]
    worker.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker.served = served
    beat = worker.slot.heartbeat_file()
    if silent_s is not None:
        beat.touch()
        os.utime(beat, (time.time() - silent_s, time.time() - silent_s))
    return worker


def test_only_a_served_worker_silent_past_the_timeout_is_killed(group: WorkerGroup) -> None:
    silent = _running(group, 0, served=True, silent_s=6.0)
    beating_worker = _running(group, 1, served=True, silent_s=1.0)
    group._kill_if_silent(silent)
    group._kill_if_silent(beating_worker)
    assert silent.process is not None and silent.process.wait(10) == -9
    assert beating_worker.process is not None and beating_worker.process.poll() is None


def test_a_starting_worker_or_a_check_turned_off_kills_nothing(group: WorkerGroup) -> None:
    starting = _running(group, 0, served=False, silent_s=60.0)  # not served yet: still loading
    no_beat_yet = _running(group, 1, served=True, silent_s=None)
    group._kill_if_silent(starting)
    group._kill_if_silent(no_beat_yet)
    group.hang_timeout_s = 0.0  # http.worker_timeout_s = 0
    starting.served = True  # served and silent for 60 s, but the check is off
    group._kill_if_silent(starting)
    time.sleep(0.2)
    assert starting.process is not None and starting.process.poll() is None
    assert no_beat_yet.process is not None and no_beat_yet.process.poll() is None
