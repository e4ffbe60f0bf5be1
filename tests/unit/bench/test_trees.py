"""``bench.trees.code_at``: another revision's code unpacked so that ``import livefit.server``
finds it. ``git archive`` is a process, which a unit test does not start: its answer is a tar
made here, with the repository's layout."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench import trees


def archive(files: dict[str, str]) -> bytes:
    """A tar of ``files`` (path -> text), as ``git archive`` writes one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def answering(monkeypatch: pytest.MonkeyPatch, returncode: int, stdout: bytes) -> list[list[str]]:
    """``subprocess.run`` in ``bench.trees`` answers as git would; returns the commands asked."""
    asked: list[list[str]] = []

    def run(command: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        asked.append(command)
        return subprocess.CompletedProcess(command, returncode, stdout, b"")

    monkeypatch.setattr(trees.subprocess, "run", run)
    return asked


def test_the_code_is_laid_out_as_setuptools_maps_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = {
        "livefit/__init__.py": "",
        "server/__init__.py": "WHICH = 'old server'\n",
        "models/builders.py": "",
        "clients/predict.py": "",
        "bench/__init__.py": "",
    }
    asked = answering(monkeypatch, 0, archive(files))
    where = trees.code_at("abc123", tmp_path / "tree")
    assert where == tmp_path / "tree"
    assert asked[0][-6:] == ["abc123", *trees.PACKAGES]
    # livefit.server, livefit.models and livefit.clients are the top-level folders
    assert (where / "livefit" / "server" / "__init__.py").read_text() == "WHICH = 'old server'\n"
    assert (where / "livefit" / "models" / "builders.py").exists()
    assert (where / "livefit" / "clients" / "predict.py").exists()
    # a second call takes the unpacked tree as it is
    assert trees.code_at("abc123", where) == where and len(asked) == 1


def test_a_revision_git_does_not_know_is_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    answering(monkeypatch, 128, b"")
    assert trees.code_at("no-such-ref", tmp_path / "tree") is None
    assert not (tmp_path / "tree").exists()
