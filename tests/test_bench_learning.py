"""The learning-quality benchmark's harness works: ``bench.learning.run(quick=True, sweep=True)``.

A real mosquitto and a real ``livefit serve`` take the first 500 samples of each stream over
MQTT, river's per-sample learners score the same samples, and the in-process sweep runs its
quick settings. The checks are on the structure of the results and the Markdown, never on the
quality: that is a benchmark figure, recorded in BENCHMARKS.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import learning

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("learning")
    return learning.run(quick=True, sweep=True, workdir=workdir, log=lambda _: None)


def _is_score(value: Any) -> bool:
    return isinstance(value, float) and 0.0 <= value <= 1.0


def test_every_stream_has_livefit_and_both_peers(results: dict[str, Any]) -> None:
    assert results["mode"] == "quick"
    assert set(results["streams"]) == set(learning.STREAMS)
    for name, stream in results["streams"].items():
        assert stream["samples"] == learning.QUICK_SAMPLES, name
        assert _is_score(stream["livefit"]["accuracy"]), name
        assert math.isfinite(stream["livefit"]["log_loss"]), name
        assert set(stream["peers"]) == {learning.LR, learning.HT}, name
        for peer in stream["peers"].values():
            assert _is_score(peer["accuracy"]), name
            assert math.isfinite(peer["log_loss"]), name
            assert peer["samples"] == learning.QUICK_SAMPLES, name
        lr = stream["peers"][learning.LR]["accuracy"]
        assert stream["difference_to_lr"] == pytest.approx(stream["livefit"]["accuracy"] - lr)
        assert isinstance(stream["pass"], bool)


def test_livefit_figures_come_from_the_server(results: dict[str, Any]) -> None:
    """Every sample trained through MQTT, in minibatches, at the settings reported."""
    for name, stream in results["streams"].items():
        livefit = stream["livefit"]
        assert livefit["samples"] == learning.QUICK_SAMPLES, name
        assert livefit["steps"] >= 1 and livefit["minibatches"] >= 1, name
        assert livefit["mean_batch_size"] >= 1, name
        assert livefit["settings"] == learning.DEFAULTS.resolved(), name


def test_sweep_and_agreement_are_recorded(results: dict[str, Any]) -> None:
    sweep = results["sweep"]
    assert sweep["rows"] and sweep["best"] and sweep["recommended"]
    for row in sweep["rows"]:
        assert set(row["streams"]) == set(learning.STREAMS)
        assert all(_is_score(s["accuracy"]) for s in row["streams"].values())
        assert row["worst_margin"] == min(row["margin_to_lr"].values())
    sides = {(r["stream"], r["side"]) for r in results["agreement"]}
    assert sides == {(name, "defaults") for name in learning.STREAMS}


def test_markdown_has_a_table_per_stream_and_the_sweep(results: dict[str, Any]) -> None:
    text = learning.markdown(results)
    assert text.startswith("## Learning quality")
    for spec in learning.STREAMS.values():
        assert f"### {spec.title}" in text
    assert "### Defaults sweep" in text
    assert learning.markdown(json.loads(json.dumps(results))) == text  # from the JSON alone


def test_the_suite_format_states_a_target_per_stream(results: dict[str, Any]) -> None:
    doc = learning.to_bench_result(results).to_json()
    assert len(doc["rows"]) == len(learning.STREAMS)
    for row in doc["rows"]:
        assert row["figures"]["livefit accuracy"]["n"] == 1
        assert [t["label"] for t in row["targets"]] == ["≥ logistic regression"]


def test_command_line_writes_json_and_markdown(tmp_path: Path, results: dict[str, Any]) -> None:
    """``main`` writes both files; here from the measured results (no second run)."""
    json_path, md_path = tmp_path / "learning.json", tmp_path / "learning.md"
    learning.write(results, json_path, md_path)
    assert json.loads(json_path.read_text())["streams"].keys() == results["streams"].keys()
    assert md_path.read_text() == learning.markdown(results)
