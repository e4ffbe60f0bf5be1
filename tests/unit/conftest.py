"""A unit test runs in the test process alone: one that starts a process fails at once, saying
where it belongs (``tests/e2e/``, which also has the brokers' fixtures)."""

from __future__ import annotations

import multiprocessing.process
import os
import platform
import subprocess
from collections.abc import Iterator

import pytest

from tests import forkserver

# The standard library's own one-off process: platform.processor() runs `uname -p` once and
# caches it, and importing TensorFlow asks for it. Asked here, before any test refuses
# processes, so the first test of a run to import TensorFlow does not fail for it.
platform.processor()

# Every way a test could start a process: subprocess and asyncio's subprocesses (Popen),
# multiprocessing, os' own, and the end-to-end tests' fork server (which a worker keeps after
# its end-to-end files, and which forks in a process of its own).
_STARTERS = [
    (subprocess.Popen, "__init__"),
    (multiprocessing.process.BaseProcess, "start"),
    *((os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
    (forkserver.ForkServer, "launch"),
]


def _refuse(*_args: object, **_kwargs: object) -> None:
    raise AssertionError(
        "a unit test starts no process: a test that needs a process or a broker belongs in "
        "tests/e2e/"
    )


@pytest.fixture(autouse=True)
def no_child_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    for owner, name in _STARTERS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, _refuse)


@pytest.fixture(autouse=True)
def shared_trainer_steps() -> Iterator[None]:
    """Trainers built through ``tests.step_pool.pooled_steps`` share traced steps (see there)."""
    # Imported here: pytest-xdist's controller loads this file too, and at the top the import
    # (TensorFlow with it) cost it 6 s of CPU beside the workers' own imports.
    from tests import step_pool

    step_pool.activate()
    yield
    step_pool.release_all()
