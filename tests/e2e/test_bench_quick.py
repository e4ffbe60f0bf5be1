"""The benchmark harness works end to end: ``python -m bench --quick`` (tiny sizes, no speed).

It runs every benchmark but the learning-quality one in a child process (real mosquitto, real
livefit processes, every peer server) and checks that the JSON holds each benchmark with its
figures, ratios, targets and machine facts, and that the Markdown is regenerated from it. It
never asserts on speed: a speed requirement is a benchmark figure, recorded in BENCHMARKS.md.

The learning benchmark's quick run is ``test_bench_learning.py``'s (its streams, sweep, JSON,
Markdown and the result ``python -m bench`` records for it): running it here again would add
about two minutes to the xdist worker that carries this file, the suite's longest (about 240 s
alone on 2 cores, 2026-11-26).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import BENCHMARKS

QUICK = [name for name in BENCHMARKS if name != "learning"]  # learning: test_bench_learning.py
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(960)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("bench")
    json_path, md_path = out / "quick.json", out / "quick.md"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--json",
            str(json_path),
            "--markdown",
            str(md_path),
            "--workdir",
            str(out / "work"),
            "--only",
            ",".join(QUICK),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # bench/results/ci_runs.md: 193-361 s in a whole run; 450 s with 4 workers
    )
    assert done.returncode == 0, f"bench failed:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return json.loads(json_path.read_text()), md_path.read_text(), json_path


def test_every_benchmark_has_figures_and_targets(quick_run: tuple[dict, str, Path]) -> None:
    doc, _, _ = quick_run
    assert set(doc["benchmarks"]) == set(QUICK)
    for name, bench in doc["benchmarks"].items():
        assert "error" not in bench, f"{name}: {bench.get('error')}"
        assert bench["mode"] == "quick"
        assert bench["rows"], f"{name} has no rows"
        for row in bench["rows"]:
            assert row["figures"], f"{name} {row['case']} has no figures"
            for spread in [*row["figures"].values(), *row["ratios"].values()]:
                assert spread["n"] >= 1 and spread["min"] <= spread["median"] <= spread["max"]
        targets = [t for row in bench["rows"] for t in row["targets"]]
        assert targets, f"{name} states no target"
        assert all(isinstance(t["pass"], bool) for t in targets)


def test_correctness_checks_pass(quick_run: tuple[dict, str, Path]) -> None:
    """Zero loss, same outputs from every server, sound freshness probes: not speed."""
    doc, _, _ = quick_run
    failed = [
        (name, c) for name, b in doc["benchmarks"].items() for c in b["checks"] if not c["pass"]
    ]
    assert not failed


def test_machine_facts_are_recorded(quick_run: tuple[dict, str, Path]) -> None:
    doc, _, _ = quick_run
    for bench in doc["benchmarks"].values():
        machine = bench["machine"]
        for key in ("cores_logical", "cpu_model", "tensorflow", "device", "recorded_at"):
            assert machine.get(key), f"{bench['name']}: machine fact {key} missing"


def test_markdown_is_regenerated_from_the_json(
    quick_run: tuple[dict, str, Path], tmp_path: Path
) -> None:
    doc, markdown, json_path = quick_run
    for bench in doc["benchmarks"].values():
        assert f"## {bench['title']}" in markdown
    again = tmp_path / "again.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--render",
            "--quick",
            "--json",
            str(json_path),
            "--markdown",
            str(again),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert again.read_text() == markdown


def test_speed_rows_measure_before_and_after_side_by_side(
    quick_run: tuple[dict, str, Path],
) -> None:
    """Issue #29: the trainer's single-sample rows carry the code before #29, measured in the
    same run (or a note says the clone lacks that commit), and the step alone beside the raw
    step, in this process and in the training process (the ceiling the trainer's ratio is read
    against); the interference rows record how busy the cores were, the load client's share
    among them."""
    doc, _, _ = quick_run
    trainer = doc["benchmarks"]["trainer"]
    single = [row for row in trainer["rows"] if row["case"]["samples per chunk"] == 1]
    for row in single:
        assert row["ratios"]["step alone ÷ raw step"]["median"] > 0, row["case"]
        assert row["ratios"]["its step alone ÷ its raw step"]["median"] > 0, row["case"]
        assert row["ratios"]["livefit ÷ no pipeline"]["median"] > 0, row["case"]
    if any("before-#29 side was skipped" in note for note in trainer["notes"]):
        assert all("before #29 ÷ its raw step" not in row["ratios"] for row in single)
    else:
        assert all(row["ratios"]["before #29 ÷ its raw step"]["median"] > 0 for row in single)
    for row in doc["benchmarks"]["interference"]["rows"]:
        busy = row["figures"]["idle: cores busy"]["median"]
        assert 0 < busy <= (os.cpu_count() or 1) + 0.01, row["case"]
        assert 0 <= row["figures"]["idle: load client's cores"]["median"] <= busy + 0.01
