"""BENCHMARKS.md is a report a reader can take in, regenerated from the committed results: the
same bytes from ``bench/results/latest.json`` and the notes in ``docs/benchmarks/``, a summary
and one table per benchmark, a "why" under every missed target, every link leading somewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.harness import lead
from bench.registry import BENCHMARKS
from bench.report import render, render_figures
from tests.unit.repo.test_readme import broken_links

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "bench" / "results"
REPORT = ROOT / "BENCHMARKS.md"
FIGURES = RESULTS / "latest.figures.md"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return json.loads((RESULTS / "latest.json").read_text())


def test_benchmarks_md_is_regenerated_byte_for_byte(doc: dict[str, Any]) -> None:
    assert render(doc) == REPORT.read_text(), (
        "BENCHMARKS.md is out of date: run .venv/bin/python -m bench --render"
    )


def test_every_figure_is_regenerated_byte_for_byte(doc: dict[str, Any]) -> None:
    assert render_figures(doc) == FIGURES.read_text(), (
        "bench/results/latest.figures.md is out of date: run .venv/bin/python -m bench --render"
    )


def test_the_report_is_short_with_one_table_per_benchmark(doc: dict[str, Any]) -> None:
    report = REPORT.read_text()
    assert len(report.splitlines()) <= 600
    sections = report.split("\n## ")[1:]
    titled = [s for s in sections if s.split("\n", 1)[0] not in ("Summary", "Running them")]
    assert len(titled) == len(doc["benchmarks"])
    for section in titled:
        tables = [b for b in section.split("\n\n") if b.startswith("| ")]
        assert len(tables) == 1, section.split("\n", 1)[0]


def test_every_missed_target_says_why(doc: dict[str, Any]) -> None:
    """A benchmark that misses a target has notes whose lead the report shows under it."""
    report = REPORT.read_text()
    for name, bench in doc["benchmarks"].items():
        if any(not t["pass"] for row in bench["rows"] for t in row["targets"]):
            why = lead(name)
            assert why, f"docs/benchmarks/{name}.md has no lead to say why {name} misses"
            assert f"**Why {name} misses a target.** {why}" in report


def test_every_measured_figure_is_in_the_figures(doc: dict[str, Any]) -> None:
    """Every figure and ratio of every row has its column in latest.figures.md."""
    figures = FIGURES.read_text()
    for name, bench in doc["benchmarks"].items():
        if BENCHMARKS[name].section is not None:
            continue  # learning: its own section, from its own JSON
        for row in bench["rows"]:
            for key in [*row["figures"], *row["ratios"]]:
                assert f" {key} |" in figures, (name, key)


def test_links_of_the_report_and_the_notes_lead_somewhere() -> None:
    pages = [REPORT, FIGURES, RESULTS / "README.md", *sorted((ROOT / "docs/benchmarks").glob("*"))]
    broken = broken_links(pages)
    assert not broken, broken
