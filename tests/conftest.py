"""What every test shares: a check that no test leaves threads behind, the ``e2e`` marker by
directory, and how the test workers share the files.

``tests/unit/`` runs in the test process alone: no broker, no child process, seconds at most.
``tests/learning/`` runs in the test process alone too, but learns streams with a real compiled
training step for seconds a test. ``tests/e2e/`` starts real processes (mosquitto, livefit, the
tools a test checks with) and gets its brokers from ``tests/e2e/conftest.py``; its tests carry
the ``e2e`` marker (``-m "not e2e"`` runs the unit and learning tests).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _worker_ports() -> str | None:
    """This test worker's own ``LIVEFIT_FREE_PORTS``: 2,000 ports below the kernel's ephemeral
    range (``ip_local_port_range``), gw0 from 10000, gw1 from 12000, gw2 from 14000, a run
    without workers last; None (the kernel picks) when the ranges would not fit below it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 8
    low = 10000 + 2000 * index
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    return f"{low}-{low + 1999}" if low + 1999 < ephemeral else None


# Set in each worker, over what the parent process set for itself.
if _ports := _worker_ports():
    os.environ["LIVEFIT_FREE_PORTS"] = _ports

E2E = Path(__file__).resolve().parent / "e2e"
LEARNING = Path(__file__).resolve().parent / "learning"
# A test's split-layout run (``tests/layouts.py``): its id carries ``split`` among its params.
SPLIT_RUN = re.compile(r"\[(?:[^\]]*-)?split(?:-[^\]]*)?\]$")


# The end-to-end files of a minute or more on a loaded 2-core CI machine, longest first (CI runs
# of 2026-11-26: bench/results/ci_runs.md). Alphabetical order put three of them near the end of the
# end-to-end files, where one of them could run alone on a worker while the other had finished.
LONGEST_FIRST = (
    "test_bench_quick.py",
    "test_bench_learning.py",
    "test_devices.py",
    "test_broker_matrix.py",
    "test_two_learners_one_replica.py",
    "test_kubernetes_processes.py",
    "test_broker_failover.py",
)


# The learning files of half a minute or more on 2 cores, longest first (their path under
# tests/learning/): each is one worker's, so started last it would run alone at the end.
LEARNING_LONGEST_FIRST = (
    "train/test_update_policy.py",
    "train/test_step_pipeline_equivalence.py",
    "models/test_target_scaling.py",
)


def _order(item: pytest.Item) -> tuple[int, int]:
    """Long end-to-end files first (``LONGEST_FIRST``), then the other end-to-end files, then
    the learning files (``LEARNING_LONGEST_FIRST`` first), then the unit files; a stable sort
    keeps each file's tests in their order. The learning files (tens of seconds each, one file
    a worker's) go before the unit files, so that they start early and the unit files, short
    and many, even out the end of a run."""
    if item.path.is_relative_to(LEARNING):
        name = item.path.relative_to(LEARNING).as_posix()
        if name in LEARNING_LONGEST_FIRST:
            return (2, LEARNING_LONGEST_FIRST.index(name))
        return (2, len(LEARNING_LONGEST_FIRST))
    if not item.path.is_relative_to(E2E):
        return (3, 0)
    if item.path.name in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(item.path.name))
    return (1, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the end-to-end tests, and run them first, the longest files first, then the
    learning files, then the unit files: the workers take files in this order
    (``--no-loadscope-reorder``), so the files of minutes start early and the short files even
    out the end, instead of one long file running alone last."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_order)


class FilesAndLayouts(LoadFileScheduling):
    """``--dist loadfile`` (a file's tests on one worker, so its module fixtures start once),
    but a file's split-layout tests form a unit of their own: the two layouts of a test file
    run on both workers at once."""

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return f"{scope}[split]" if SPLIT_RUN.search(nodeid) else scope


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    return FilesAndLayouts(config, log) if config.getvalue("dist") == "loadfile" else None


# Threads that libraries (and ``children.start_child``'s spawner) start once per process and
# keep by design.
_BENIGN_THREAD_PREFIXES = ("asyncio_", "ThreadPoolExecutor", "pytest_timeout", "livefit-spawner")


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread of ours running (Home Assistant's verify_cleanup)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.name.startswith(_BENIGN_THREAD_PREFIXES)
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"
