"""One learner per storage directory: an OS file lock held for the life of the process.

``storage.dir/livefit.lock`` is locked with ``fcntl.flock``; the kernel releases the lock when
the process exits in any way, SIGKILL included, so a stale lock file never blocks a restart.
The file also says who holds it (pid, host, HTTP port, start time), so that a second learner on
the same directory can name the first one in its error message and exit before it touches the
log, the checkpoints or the broker.

A lock on a file that was deleted (``rm -rf`` of the storage dir while the learner runs) or
replaced proves nothing: another learner would create a new file and lock it. ``lost`` says
when the file at the path is no longer the one locked, and ``retake`` locks the path again
(recreating the directory): ``storage.watch`` does both, so a second learner on the path is
still refused while the first runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_NAME = "livefit.lock"


class StorageLocked(Exception):
    """The storage directory cannot be ours: another process holds it (the message names it),
    or it cannot be written at all (read-only, no permission, no space for the lock file)."""


class StorageLock:
    """Exclusive, non-blocking lock on a storage directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = None
        self._owner: tuple[int | None, int | None] = (None, None)  # acquire's arguments

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, http_port: int | None = None, owner_pid: int | None = None) -> StorageLock:
        """Lock, or raise ``StorageLocked`` at once (never waits). ``owner_pid``: the process
        the file names as the holder when it is not this one (a split learner's training
        process names the ``livefit serve`` that started it: stopping that one stops the
        learner; stopping the training process would only get it restarted)."""
        if self._fd is not None:
            return self
        self._owner = (http_port, owner_pid)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageLocked(
                f"storage dir {self.directory} is not writable ({exc.strerror or exc}); "
                "a learner keeps its log and checkpoints there: set storage.dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StorageLocked(
                f"storage dir {self.directory} is in use by another livefit learner "
                f"({holder}); stop that process or give this one another storage.dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        owner = {
            "pid": owner_pid or os.getpid(),
            "host": socket.gethostname(),
            "http_port": http_port,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode() + b"\n", 0)
        self._fd = fd
        return self

    def lost(self) -> str | None:
        """Why the lock no longer proves anything (its file deleted, or the path now names
        another file), or None while the file at the path is the one locked (or none is held)."""
        fd = self._fd
        if fd is None:
            return None
        try:
            held = os.fstat(fd)
            if held.st_nlink == 0:
                return f"the lock file {self.path} was deleted"
            now = os.stat(self.path)
        except FileNotFoundError:
            return f"the lock file {self.path} is gone"
        except OSError:  # cannot tell (EIO, ...): storage faults are reported where they occur
            return None
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return f"the lock file {self.path} was replaced by another one"
        return None

    def retake(self) -> StorageLock:
        """Drop the lock on a file that is gone and lock the path again (the directory is
        recreated when missing); ``StorageLocked`` when another process got it first."""
        self.release()
        return self.acquire(*self._owner)

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a process locking it now)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return "holder unknown"
    if not isinstance(owner, dict) or "pid" not in owner:
        return "holder unknown"
    port = f", HTTP port {owner['http_port']}" if owner.get("http_port") else ""
    return (
        f"pid {owner['pid']} on {owner.get('host', '?')}{port}, "
        f"started {owner.get('started_at', '?')}"
    )
