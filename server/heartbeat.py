"""Liveness of a worker group's serving processes: a process that stops answering (SIGSTOPped,
or its event loop wedged) is killed and started again, as gunicorn's arbiter does with a
worker past its ``--timeout``.

Each serving process's event loop touches ``<index>.alive`` in the group's directory every
``BEAT_S`` (``beat``): it is the loop that answers requests, so a loop that cannot run cannot
beat. The group's parent reads the file's age (``silent_for``) and SIGKILLs a process that
served and then stayed silent for ``http.worker_timeout_s``; SIGKILL reaches a stopped process
too, and the group's restart rules take over (counted like any other death).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

log = logging.getLogger(__name__)
BEAT_S = 1.0


def beat_file(directory: Path, index: int) -> Path:
    """The file serving process ``index`` of the group in ``directory`` keeps touching."""
    return directory / f"{index}.alive"


def touch(path: Path) -> None:
    """Set ``path``'s modification time to now (creating it); never raises."""
    try:
        path.touch()
        os.utime(path)
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


def silent_for(path: Path, now: float | None = None) -> float | None:
    """Seconds since ``path`` was last touched; None when it does not exist (yet)."""
    try:
        touched = path.stat().st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - touched)
