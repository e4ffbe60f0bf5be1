"""Lint and types are part of the test command: ruff over the tree, mypy over the packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("livefit", "server", "models", "clients")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


LINTED = ("server", "clients", "models", "livefit", "tests", "bench", "docs")


def test_ruff() -> None:
    result = run("ruff", "check", *LINTED)
    assert result.returncode == 0, result.stdout[-3000:]


def test_ruff_format() -> None:
    """The tree is as ``ruff format`` writes it (``# fmt: skip`` where a hand layout reads
    better): ``ruff format .`` fixes a failure."""
    result = run("ruff", "format", "--check", *LINTED)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as pip installs it (``livefit/``, ``livefit/server``, ...), a real copy.

    The editable install maps ``livefit.server`` to ``server/`` through an import hook mypy
    cannot see; checked as plain directories, every cross-package ``from livefit...`` import
    would be unresolved and typed ``Any``. Installed into a directory of its own, the tree is the
    one users get, and types cross modules."""
    source = tmp_path_factory.mktemp("source")  # built from a copy: setuptools writes build/
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in SOURCES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path_factory.mktemp("installed")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-compile", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return target


def mypy(installed: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """mypy over the installed copy; its paths in the output are the repository's."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), *args],
        cwd=installed, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MYPYPATH": str(installed)},
    )  # fmt: skip
    for folder in SOURCES[1:]:
        result.stdout = result.stdout.replace(f"livefit/{folder}/", f"{folder}/")
    return result


def test_mypy(installed: Path) -> None:
    result = mypy(installed, "--config-file", str(ROOT / "pyproject.toml"), "-p", "livefit")
    assert result.returncode == 0, result.stdout[-3000:]


def test_mypy_sees_types_across_livefit_modules(installed: Path, tmp_path: Path) -> None:
    """A misuse of one livefit module's type from another is an error, not ``Any``."""
    probe = tmp_path / "probe.py"
    probe.write_text("from livefit.server.base.metrics import Metrics\n\nMetrics().init_model(1)\n")
    result = mypy(installed, "--config-file", str(ROOT / "pyproject.toml"), str(probe))
    assert result.returncode == 1 and 'incompatible type "int"' in result.stdout, result.stdout
