"""A worker group's liveness check (``server/base/heartbeat.py``, ``WorkerGroup._kill_if_silent``):
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

from livefit.server.base.heartbeat import Silence, beating
from livefit.server.runtime.workers import GroupMember, WorkerGroup


def test_the_event_loop_beats_while_inside_and_stops_after(tmp_path: Path) -> None:
    path = tmp_path / "0.alive"
    silence = Silence()

    async def serve_a_while() -> float:
        async with beating(path):
            await asyncio.sleep(0.05)
            assert silence.observe(path, now=0.0) == 0.0  # the first sight of a beat
            assert silence.observe(path, now=0.5) == 0.5  # no beat in between
            await asyncio.sleep(1.1)  # the next beat (every second)
            return silence.observe(path, now=20.0)

    assert asyncio.run(serve_a_while()) == 0.0  # it beat: silence starts again
    assert silence.observe(path, now=27.0) == 7.0  # stopped beating when the loop left
    assert Silence().observe(tmp_path / "absent", now=5.0) == 0.0


def test_a_wall_clock_step_is_not_silence(tmp_path: Path) -> None:
    """The file's time is never compared with the clock: a heartbeat seen for the first time
    with a time far in the past (the wall clock stepped forward, the machine resumed from
    suspend) starts the count; only the watcher's own monotonic time counts."""
    path = tmp_path / "0.alive"
    path.touch()
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    silence = Silence()
    assert silence.observe(path, now=100.0) == 0.0
    assert silence.observe(path, now=101.0) == 1.0


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
