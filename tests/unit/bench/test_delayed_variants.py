"""``bench.delayed_variants``: its summary against river's best, and unknown variants refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.delayed_variants import VARIANTS, main, summary


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
