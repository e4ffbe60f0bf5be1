"""The code of another git revision, unpacked beside this checkout, to measure it side by side
with the working tree (the trainer benchmark's "before #29" side, ``bench.start_time``)."""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

from bench.harness import REPO

PACKAGES = ("livefit", "server", "models", "clients", "bench")


def code_at(ref: str, where: Path) -> Path | None:
    """The code of ``ref`` (livefit, server, models, clients, bench) unpacked in ``where``, laid
    out so that ``import livefit.server`` and ``import bench`` find it first when ``where`` is
    the working directory and on ``PYTHONPATH``; None where this repository's history lacks
    ``ref``. An existing unpacked tree in ``where`` is taken as it is."""
    if (where / "livefit" / "server").exists():
        return where
    done = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, *PACKAGES], capture_output=True, timeout=120
    )
    if done.returncode != 0:
        return None
    where.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=BytesIO(done.stdout)) as archive:
        archive.extractall(where, filter="data")
    for package in ("server", "models", "clients"):  # what setuptools maps into livefit.*
        (where / "livefit" / package).symlink_to(Path("..") / package)
    return where
