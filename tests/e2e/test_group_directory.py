"""A worker group's private directory (``server/runtime/group_directory.py``): it fits its
Unix sockets under any ``TMPDIR``, and a new group removes the directories that SIGKILLed
parents left behind, and only those.

The owners here are real processes: a child that has exited (its pid is free), this test's
own process (running), this process's pid recorded with another start time (a reused pid), a
live process that holds the owner file's lock and records a dead pid, and a real group
directory made in another PID namespace (pid 1 there), whose pid means nothing here.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from livefit.server.runtime import group_directory as directories
from livefit.server.runtime.group_directory import (
    OWNER_FILE,
    PREFIX,
    SHORT_TMP,
    group_directory,
    owner_record,
    release_group_directory,
    sweep_abandoned,
)
from livefit.server.runtime.listening import StartupError


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left(parent: Path, name: str, owner: str | None) -> Path:
    directory = parent / f"{PREFIX}{name}"
    directory.mkdir(mode=0o700)
    (directory / "0.sock").write_bytes(b"")  # something inside, as a real group leaves
    if owner is not None:
        (directory / OWNER_FILE).write_text(owner)
    return directory


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh temporary directory short enough for sockets (pytest's own may be too deep)."""
    short = Path(tempfile.mkdtemp(prefix="s", dir=SHORT_TMP))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    yield short
    shutil.rmtree(short)


def test_a_new_group_removes_only_directories_whose_parent_is_gone(short_tmp: Path) -> None:
    mine = owner_record(os.getpid())
    assert mine is not None and len(mine.split()) == 2  # pid and start time, on Linux
    killed = _left(short_tmp, "killed", f"{_dead_pid()} 12345\n")
    reused = _left(short_tmp, "reused", f"{os.getpid()} {int(mine.split()[1]) + 1}\n")
    running = _left(short_tmp, "running", mine)
    unowned = _left(short_tmp, "unowned", None)  # being made now, or by an older livefit
    garbled = _left(short_tmp, "garbled", "x\n")
    wide = _left(short_tmp, "wide", f"{_dead_pid()}\n")
    wide.chmod(0o755)  # livefit's are 0700: not one of ours
    linked = _left(short_tmp, "linked", None)
    (short_tmp / "elsewhere").write_text(f"{_dead_pid()}\n")
    (linked / OWNER_FILE).symlink_to(short_tmp / "elsewhere")
    unrelated = short_tmp / "someone-else"
    unrelated.mkdir()
    target = _left(short_tmp, "target-of-a-link", f"{_dead_pid()}\n").rename(short_tmp / "t")
    pointer = short_tmp / f"{PREFIX}pointer"
    pointer.symlink_to(target)  # a link named like ours, to a directory that looks abandoned

    directory = group_directory()

    assert directory.parent == short_tmp
    assert (directory / OWNER_FILE).read_text() == mine
    assert not killed.exists() and not reused.exists()
    assert running.exists() and unowned.exists() and garbled.exists() and unrelated.exists()
    assert wide.exists() and linked.exists()
    assert pointer.is_symlink() and (target / "0.sock").exists()  # neither link nor target
    release_group_directory(directory)
    assert not directory.exists()


def test_a_directory_in_use_survives_another_groups_sweep(short_tmp: Path) -> None:
    first = group_directory()
    second = group_directory()
    assert first.exists() and second.exists() and first != second
    assert sweep_abandoned(short_tmp) == 0
    for directory in (first, second):
        release_group_directory(directory)


def test_a_sweep_that_cannot_remove_a_directory_leaves_it_and_goes_on(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck = _left(short_tmp, "stuck", f"{_dead_pid()}\n")
    gone = _left(short_tmp, "gone", f"{_dead_pid()}\n")

    def refuse(path: Path, *args: object, **kwargs: object) -> None:
        if path == stuck:
            raise PermissionError(13, "read-only", str(path))
        real_rmtree(path)

    real_rmtree = shutil.rmtree
    monkeypatch.setattr(directories.shutil, "rmtree", refuse)
    assert sweep_abandoned(short_tmp) == 1
    assert stuck.exists() and not gone.exists()


def test_a_deep_tmpdir_still_gives_the_group_a_directory_its_sockets_fit_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split learner's sockets live in its group's directory; under a TMPDIR too deep for a
    Unix socket's path (108 bytes) the directory is made in /tmp instead, and the longest
    socket the group binds there (the weight feed's temporary name) binds."""
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    short = Path(tempfile.mkdtemp(prefix="s", dir=SHORT_TMP))  # tmp_path may be too deep itself
    try:
        for parent in (short, Path(SHORT_TMP)):
            monkeypatch.setattr(tempfile, "tempdir", str(short if parent == short else deep))
            directory = group_directory()
            try:
                assert directory.parent == parent, directory
                assert stat.S_IMODE(directory.stat().st_mode) == 0o700
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.bind(str(directory / ".weights.sock.4194304"))
            finally:
                release_group_directory(directory)
    finally:
        shutil.rmtree(short)


def test_a_deep_tmpdir_without_a_usable_tmp_is_a_clear_startup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr(directories, "SHORT_TMP", str(tmp_path / "absent"))
    with pytest.raises(StartupError, match="set TMPDIR to a shorter path"):
        group_directory()
    assert list(deep.iterdir()) == []  # the directory too deep to use is not left behind


# Holds a directory's owner file locked, as a live group's parent does, with a record whose pid
# is dead here (a parent in another PID namespace); prints "locked", exits when stdin closes.
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, sys.argv[2].encode())
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_live_owner_holding_its_lock_is_left_whatever_pid_it_records(short_tmp: Path) -> None:
    dead = f"{_dead_pid()} 12345\n"
    held = _left(short_tmp, "held", None)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(held / OWNER_FILE), dead],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "locked\n"
        unlocked = _left(short_tmp, "unlocked", dead)  # the same record, nobody holding it
        assert sweep_abandoned(short_tmp) == 1
        assert held.exists() and (held / "0.sock").exists() and not unlocked.exists()
    finally:
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()
    assert sweep_abandoned(short_tmp) == 1  # its owner is gone now: no lock, a dead pid
    assert not held.exists()


# A real group directory made by livefit's own code in a PID namespace of its own: the owner is
# pid 1 there, with /proc mounted for that namespace. Exits when stdin closes.
IN_NAMESPACE = """
import sys, tempfile
tempfile.tempdir = sys.argv[1]
from livefit.server.runtime.group_directory import group_directory
print(group_directory(), flush=True)
sys.stdin.read()
"""


def test_a_live_group_in_another_pid_namespace_survives_a_sweep_here(short_tmp: Path) -> None:
    """Learners in two containers sharing /tmp: one's sweep removed the other's live directory
    (its pid, 1 there, is another process here, started at another time)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a PID namespace")
    owner = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", IN_NAMESPACE,
         str(short_tmp)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdin is not None and owner.stdout is not None and owner.stderr is not None
    try:
        line = owner.stdout.readline().strip()
        if not line:
            pytest.skip(f"unshare --pid refused: {owner.stderr.read()[-500:]}")
        theirs = Path(line)
        assert (theirs / OWNER_FILE).read_text().split()[0] == "1"  # a pid that is not theirs here
        mine = group_directory()  # sweeps beside itself
        try:
            assert theirs.exists(), "a live group's directory was removed by another's sweep"
        finally:
            release_group_directory(mine)
    finally:
        owner.stdin.close()
        owner.wait(10)
        owner.stdout.close()
        owner.stderr.close()
    assert sweep_abandoned(short_tmp) == 1 and not theirs.exists()  # gone with its owner
