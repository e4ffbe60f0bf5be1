"""Lint and types are part of the test command: ruff over the tree, mypy over the packages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff() -> None:
    result = run("ruff", "check", "server", "clients", "models", "livefit", "tests", "bench")
    assert result.returncode == 0, result.stdout[-3000:]


def livefit_tree(root: Path) -> Path:
    """The installed layout (``livefit/``, ``livefit/server``, ...) as links under ``root``.

    The editable install maps ``livefit.server`` to ``server/`` through an import hook mypy
    cannot see; checked as plain directories, every ``from livefit...`` import would be
    unresolved and typed ``Any``. Checked as ``livefit`` here, types cross modules."""
    package = root / "livefit"
    package.mkdir(parents=True)
    for path in (ROOT / "livefit").iterdir():
        if path.suffix == ".py" or (path.is_dir() and path.name != "__pycache__"):
            (package / path.name).symlink_to(path)
    for name in ("server", "models", "clients"):
        (package / name).symlink_to(ROOT / name)
    return root


def mypy(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MYPYPATH": str(tree)},
    )  # fmt: skip


def test_mypy(tmp_path: Path) -> None:
    result = mypy(livefit_tree(tmp_path), "-p", "livefit")
    assert result.returncode == 0, result.stdout[-3000:]


def test_mypy_sees_types_across_livefit_modules(tmp_path: Path) -> None:
    """A misuse of one livefit module's type from another is an error, not ``Any``."""
    tree = livefit_tree(tmp_path / "tree")
    probe = tmp_path / "probe.py"
    probe.write_text("from livefit.server.metrics import Metrics\n\nMetrics().export(1)\n")
    result = mypy(tree, str(probe))
    assert result.returncode == 1 and 'incompatible type "int"' in result.stdout, result.stdout
