"""``bench.delayed_variants``: its summary against river's best, unknown variants refused, and
each run's rows added to the file under the next run number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.delayed_variants import VARIANTS, main, numbered, recorded, summary


def row(stream: str, variant: str, livefit: float, best: float, task: str) -> dict[str, object]:
    return {"stream": stream, "delay": "none", "variant": variant, "repeat": 0,
            "livefit": livefit, "river_best": best, "task": task}  # fmt: skip


def test_summary_gives_points_or_the_mae_ratio_with_the_median_of_the_runs() -> None:
    rows = [
        row("led", "defaults", 0.750, 0.755, "multiclass"),
        row("led", "defaults", 0.760, 0.755, "multiclass"),
        row("led", "defaults", 0.740, 0.755, "multiclass"),
        row("trump", "window0", 0.772, 0.386, "regression"),
    ]
    lines = summary(rows)
    assert len(lines) == 2
    assert "defaults" in lines[0] and "-0.500 points" in lines[0]
    assert "(runs -0.500, +0.500, -1.500)" in lines[0]
    assert "window0" in lines[1] and "2.000 x river's best MAE" in lines[1]


def test_an_unknown_variant_is_refused_naming_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "rows.json"), "--variants", "defaults,nope"])
    error = capsys.readouterr().err
    assert "nope" in error and all(name in error for name in VARIANTS)
    assert not (tmp_path / "rows.json").exists()


def test_a_run_is_added_to_the_earlier_ones_under_the_next_number(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    assert recorded(path) == []
    first = numbered([], [row("led", "defaults", 0.75, 0.755, "multiclass")] * 2)
    assert [r["run"] for r in first] == [1, 1]
    path.write_text(json.dumps(first))
    second = numbered(recorded(path), [row("led", "window0", 0.76, 0.755, "multiclass")])
    assert [(r["run"], r["variant"]) for r in second] == [
        (1, "defaults"), (1, "defaults"), (2, "window0"),
    ]  # fmt: skip
    path.write_text(json.dumps({"not": "rows"}))
    with pytest.raises(SystemExit, match="not a list of rows"):
        recorded(path)
