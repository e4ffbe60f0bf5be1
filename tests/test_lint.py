"""Lint and types are part of the test command: ruff over the tree, mypy over the packages."""

from __future__ import annotations

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


def test_mypy() -> None:
    result = run("mypy", "server", "clients", "models", "livefit")
    assert result.returncode == 0, result.stdout[-3000:]
