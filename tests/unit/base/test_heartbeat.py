"""A worker group's liveness check (``server/base/heartbeat.py``): a serving process's event
loop beats while inside and stops after, and a wall-clock step is not silence. The parent
killing a silent process: ``tests/e2e/test_heartbeat_kill.py``; the end-to-end case (SIGSTOP
of a split learner's serving process, killed and started again) is
``test_learner_group.py``'s."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from livefit.server.base.heartbeat import Silence, beating


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
