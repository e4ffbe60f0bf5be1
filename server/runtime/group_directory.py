"""The private directory of a worker group (its Unix sockets and shared board), and the sweep
of directories a SIGKILLed parent left behind.

A group's directory is ``livefit-workers-*`` in the temporary directory (``TMPDIR``), or in
/tmp when that path is too long for a Unix socket in it. The parent removes it when it stops
(``release_group_directory``); a SIGKILLed parent cannot. So each directory has an ``owner``
file that its parent holds locked (``flock``) for as long as it lives, and in which it records
its pid and the kernel's start time of that process; every new group removes the directories
in the same places whose owner is gone.

Gone means both: nobody holds the lock (the kernel drops it with the last descriptor, when the
parent dies in any way), and the recorded pid is not running with the recorded start time. A
held lock alone proves the owner alive: a learner in another PID namespace that shares /tmp
(another container) records a pid that means nothing here, and its live directory was removed
under it when the pid was all the sweep judged by (``FileNotFoundError .../busy``). The pid
check stays for owners that hold no lock (a livefit from before the lock) and where ``flock``
is refused. A directory without an ``owner`` file, or with an empty one, is left alone: its
parent may be making it now (it locks the file before it writes the record), or it is not ours
to judge; so is one that is not this user's, not 0700, or whose ``owner`` is not a regular
file (none of which livefit makes).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from .children import stat_fields
from .listening import StartupError

log = logging.getLogger(__name__)

PREFIX = "livefit-workers-"
OWNER_FILE = "owner"
# Unix sockets live in the group's directory, and a socket's path must fit sockaddr_un's
# sun_path: 108 bytes with its NUL on Linux. The longest name put there is the weight feed's
# temporary ".weights.sock.<pid>" (a pid has at most 7 digits), after a "/".
SUN_PATH_MAX = 107
MAX_GROUP_DIRECTORY = SUN_PATH_MAX - len("/.weights.sock.4194304")
SHORT_TMP = "/tmp"
_held: dict[Path, int] = {}  # the locked owner file of each group directory this process owns


def group_directory() -> Path:
    """A new private (0700) directory for a group's sockets and shared board: in the temporary
    directory (``TMPDIR``), or in /tmp when that path is too long for a Unix socket in it (a
    deep ``TMPDIR`` failed the split learner's start with "AF_UNIX path too long"). It records
    this process as its owner, and its owner file stays locked until ``release_group_directory``
    (or this process's end); abandoned directories beside it are removed first."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    if len(os.fsencode(path)) > MAX_GROUP_DIRECTORY:
        path.rmdir()
        try:
            path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=SHORT_TMP))
        except OSError as exc:
            raise StartupError(
                f"the temporary directory {path.parent} is too deep for Unix sockets (a "
                f"socket's path must fit in 108 bytes) and {SHORT_TMP} cannot be used instead "
                f"({exc}): set TMPDIR to a shorter path"
            ) from exc
    _hold_owner_file(path)
    sweep_abandoned(path.parent, keep=path)
    return path


def _hold_owner_file(directory: Path) -> None:
    """Create ``directory``'s owner file, lock it for as long as this process holds the
    directory, and record this process in it. Locked before the record is written: a sweep
    finds the file empty (not judged) or locked, never a record it could take for abandoned."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(directory / OWNER_FILE, flags, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # no locks on this file system: the pid still tells
            log.debug("cannot lock %s: %s", directory / OWNER_FILE, exc)
        os.write(fd, (owner_record(os.getpid()) or f"{os.getpid()}\n").encode())
    except BaseException:
        os.close(fd)
        raise
    _held[directory] = fd


def release_group_directory(directory: Path) -> None:
    """Remove a group directory this process made (``group_directory``), then drop its lock.
    Never raises: it runs on the way out."""
    shutil.rmtree(directory, ignore_errors=True)
    fd = _held.pop(directory, None)
    if fd is not None:
        os.close(fd)


def owner_record(pid: int) -> str | None:
    """``"<pid> <start time>"`` for a running process (its start time in clock ticks since
    boot, from /proc), ``"<pid>"`` where /proc is not there; None when it is not running."""
    try:
        fields = stat_fields(pid)
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else _pid_only(pid)
    except OSError:
        return _pid_only(pid)
    return f"{pid} {fields[22 - 3]}\n"  # field 22, the start time


def _pid_only(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # running, as another user
    return f"{pid}\n"


def is_abandoned(directory: Path) -> bool:
    """True when nobody holds ``directory``'s owner file locked and it records an owner that
    is no longer running (a reused pid with another start time counts as gone)."""
    try:
        fd = os.open(directory / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # being made, a link, or not made by a sweeping livefit: not ours to judge
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # not what livefit writes
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its owner holds it: alive, whatever its pid says in this namespace
        except OSError as exc:  # no locks on this file system: the pid alone tells
            log.debug("cannot lock %s: %s", directory / OWNER_FILE, exc)
        recorded = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        pid = int(recorded.split()[0])
    except (IndexError, ValueError):
        return False
    current = owner_record(pid)
    if current is None:
        return True
    return len(recorded.split()) == 2 == len(current.split()) and recorded != current


def sweep_abandoned(parent: Path, keep: Path | None = None) -> int:
    """Remove this user's ``livefit-workers-*`` directories in ``parent`` whose owner is gone;
    how many were removed. Never raises: a sweep that fails leaves the directories."""
    removed = 0
    try:
        entries = list(parent.glob(f"{PREFIX}*"))
    except OSError:
        return 0
    uid = os.geteuid()
    for entry in entries:
        try:
            if entry == keep or entry.is_symlink() or not entry.is_dir():
                continue
            info = entry.stat()
            if info.st_uid != uid or stat.S_IMODE(info.st_mode) != 0o700:
                continue  # not a directory livefit made (mkdtemp's are 0700)
            if not is_abandoned(entry):
                continue
            shutil.rmtree(entry)
        except OSError as exc:
            log.debug("could not sweep %s: %s", entry, exc)
            continue
        removed += 1
        log.info("removed %s, left by a livefit group whose parent was killed", entry)
    return removed
