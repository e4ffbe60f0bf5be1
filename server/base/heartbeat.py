"""Liveness of a worker group's processes: a process that stops answering (SIGSTOPped, or its
event loop wedged) is killed and started again, as gunicorn's arbiter does with a worker past
its ``--timeout``.

Each serving process's event loop touches ``<index>.alive`` in the group's directory every
``BEAT_S`` (``beat``): it is the loop that answers requests, so a loop that cannot run cannot
beat. A split learner's training process beats ``training.alive`` from its main thread (the
one that sends its status to the serving processes), as often as it sends it.

The group's parent watches the files (``Silence``) and SIGKILLs a process that was ready and
then stayed silent for ``http.worker_timeout_s``; SIGKILL reaches a stopped process too, and
the group's restart rules take over (counted like any other death). Silence is timed by the
parent's monotonic clock from when it last saw the file change, never as "now minus the
file's time": a wall clock stepped forward (NTP) or a machine resumed from suspend would
otherwise look like every process gone silent at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
BEAT_S = 1.0


def beat_file(directory: Path, label: int | str) -> Path:
    """The file process ``label`` of the group in ``directory`` keeps touching (a serving
    process's index; ``"training"`` for a split learner's training process)."""
    return directory / f"{label}.alive"


def touch(path: Path) -> None:
    """Set ``path``'s modification time to now (creating it); never raises."""
    try:
        path.touch()  # an existing file's times are set to now
    except OSError as exc:  # the group's directory is gone: the parent is stopping
        log.debug("heartbeat %s: %s", path, exc)


async def beat(path: Path, interval_s: float = BEAT_S) -> None:
    """Touch ``path`` every ``interval_s`` from the running event loop, until cancelled."""
    while True:
        touch(path)
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def beating(path: Path | None) -> AsyncIterator[None]:
    """``beat`` in a task of this loop while inside (nothing with ``path`` None)."""
    if path is None:
        yield
        return
    task = asyncio.create_task(beat(path), name="livefit-heartbeat")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def last_beat(path: Path) -> int | None:
    """``path``'s modification time (ns), or None when it does not exist (yet)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@dataclass(slots=True)
class Silence:
    """How long one heartbeat file has stayed unchanged, by the watcher's monotonic clock."""

    beat: int | None = None  # the file's time (ns) when last seen changed
    since: float = 0.0  # time.monotonic() then

    def observe(self, path: Path, now: float | None = None) -> float:
        """Seconds the file has not changed for, as seen by the checks so far (0 when it
        changed since the last check, or does not exist)."""
        beat = last_beat(path)
        now = time.monotonic() if now is None else now
        if beat is None or beat != self.beat:
            self.beat, self.since = beat, now
            return 0.0
        return now - self.since
