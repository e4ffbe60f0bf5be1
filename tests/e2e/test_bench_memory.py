"""The memory benchmark's process-tree sampler and its figures, without a learner.

A Python process starting two children named as a split learner's training process and its
serving process stands in for ``livefit serve --workers 1``; the sampler must find all three,
tell their roles apart (the serving one only once it has run ``exec`` and named itself:
before, it is still a copy of its parent), sum them, and see a
restarted child as a new process. The growth figure is checked on a made-up series.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from bench.memory import MAIN, TreeRssSampler, _row

pytestmark = pytest.mark.timeout(60)

# A child that names itself (as livefit names a group's processes), then sleeps.
NAMED = "import sys; from livefit.server.runtime.fork_server import set_process_name; " \
        "set_process_name(sys.argv[1]); import time; time.sleep(60)"  # fmt: skip
# Named as a serving process only when it runs exec, once the file argv[1] exists.
LATE = f"""
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
os.execv(sys.executable, [sys.executable, "-c", {NAMED!r}, "livefit-w0"])
"""
# Starts a "training" child and the late "serving 0" child, restarts the serving one (at
# once named) when told on stdin, and waits.
PARENT = f"""
import subprocess, sys
def start(name):
    return subprocess.Popen([sys.executable, "-c", {NAMED!r}, name])
children = [start("livefit-train"), subprocess.Popen([sys.executable, "-c", {LATE!r}, sys.argv[1]])]
print("up", flush=True)
for line in sys.stdin:
    children[1].kill(); children[1].wait()
    children[1] = start("livefit-w0")
    print("restarted", flush=True)
"""


def _until(found: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not found():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_tree_is_sampled_by_role_and_a_restart_is_seen(tmp_path: Path) -> None:
    gate = tmp_path / "exec"
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, str(gate)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            _sample_the_tree(parent, gate)
        finally:
            children = psutil.Process(parent.pid).children(recursive=True)
            parent.kill()
            for child in children:
                child.kill()


def _sample_the_tree(parent: subprocess.Popen[str], gate: Path) -> None:
    assert parent.stdout is not None and parent.stdin is not None
    assert parent.stdout.readline().strip() == "up"
    sampler = TreeRssSampler(parent.pid, every_s=0.05)
    _until(lambda: {MAIN, "training"} <= set(sampler.read()), "no training process")
    early = sampler.read()
    assert len(early) == 3 and "serving 0" not in early  # not yet past exec: its name
    gate.touch()
    _until(lambda: set(sampler.read()) == {MAIN, "training", "serving 0"}, "no serving role")
    rss = sampler.read()
    assert all(size > 1 << 20 for size in rss.values())  # each a Python of its own
    pss = sampler.pss()
    assert set(pss) == set(rss)
    assert sum(pss.values()) < sum(rss.values())  # shared pages divided, not repeated
    with sampler:
        time.sleep(0.3)
        parent.stdin.write("restart\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "restarted"
        # the new child names itself after its imports: a second or more on a loaded host
        restarted = lambda: len(sampler.pids.get("serving 0", ())) == 2  # noqa: E731
        _until(restarted, "the restarted serving process never seen by its name")
    assert len(sampler.samples) >= 4
    assert len(sampler.pids["serving 0"]) == 2
    assert len(sampler.pids["training"]) == len(sampler.pids[MAIN]) == 1


def test_growth_is_the_end_total_over_the_total_after_warm_up() -> None:
    mib = 2**20
    series = [
        (float(t), {MAIN: 100 * mib, "training": (200 + (10 if t >= 90 else 0)) * mib})
        for t in range(101)
    ]
    row = _row(series, {MAIN: 50 * mib, "training": 150 * mib}, "serve --workers 1", 10, 1)
    assert row.figures["RSS after warm-up MiB"].median == 300
    assert row.figures["RSS at end MiB"].median == 310
    assert row.figures["growth %"].median == pytest.approx(100 * (310 / 300 - 1))
    assert row.figures["PSS at end MiB"].median == 200
    assert row.figures["training RSS at end MiB"].median == 210
    assert [t.subject for t in row.targets] == ["growth %"]
    assert row.targets[0].passed
