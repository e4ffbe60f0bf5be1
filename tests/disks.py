"""Small disks for the tests that fill one: a tmpfs of a given size, mounted for a test."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``: "2m") at ``mount``, unmounted on exit (needs
    root and mount; the test is skipped elsewhere)."""
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small tmpfs needs root (mount -t tmpfs)")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` with one file until at most ``leave`` bytes are free; returns the file."""
    filler = disk / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                free = shutil.disk_usage(disk).free
                if free <= leave:
                    break
                handle.write(b"\0" * min(free - leave, 1 << 20))
                handle.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler
