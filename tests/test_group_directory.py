"""A worker group's private directory (``server/processes/group_directory.py``): it fits its
Unix sockets under any ``TMPDIR``, and a new group removes the directories that SIGKILLed
parents left behind, and only those.

The owners here are real processes: a child that has exited (its pid is free), this test's
own process (running), and this process's pid recorded with another start time (a reused pid).
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

from livefit.server.processes import group_directory as directories
from livefit.server.processes.group_directory import (
    OWNER_FILE,
    PREFIX,
    SHORT_TMP,
    group_directory,
    owner_record,
    sweep_abandoned,
)
from livefit.server.processes.listening import StartupError


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


def test_a_directory_in_use_survives_another_groups_sweep(short_tmp: Path) -> None:
    first = group_directory()
    second = group_directory()
    assert first.exists() and second.exists() and first != second
    assert sweep_abandoned(short_tmp) == 0


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
                shutil.rmtree(directory)
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
