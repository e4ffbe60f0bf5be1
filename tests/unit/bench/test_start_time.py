"""``bench.start_time``: its learner's config, the summary of its rows, unknown layouts refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.start_time import LAYOUTS, config, main, summary
from livefit.server.config.settings import load_settings


def test_the_config_is_one_linear_model_in_the_layout_asked(tmp_path: Path) -> None:
    for layout, workers in LAYOUTS.items():
        path = tmp_path / f"{layout}.toml"
        path.write_text(config("mqtt://127.0.0.1:1883", tmp_path / "data-0", workers))
        settings = load_settings(path)
        assert settings.http.workers == workers
        assert list(settings.models) == ["demo"]
        assert settings.models["demo"].builder == "linear"


def test_the_summary_gives_each_ref_and_layout_its_median_and_range() -> None:
    rows = [
        {"ref": "new", "layout": "one", "ready_s": ready, "cpu_s": cpu}
        for ready, cpu in ((3.9, 4.0), (3.8, 3.9), (4.3, 4.4))
    ] + [{"ref": "old", "layout": "one", "ready_s": 5.1, "cpu_s": 5.2}]
    rows += [{"ref": "new", "layout": "split", "ready_s": 4.0, "cpu_s": 5.0, "pss_mib": pss,
              "serving_back_s": back} for pss, back in ((700.0, 1.5), (650.0, 2.5))]  # fmt: skip
    lines = summary(rows)
    assert len(lines) == 3
    assert lines[0].startswith("one   new") and "ready  3.90 s (3.80-4.30)" in lines[0]
    assert "CPU  4.00 s (3.90-4.40), 3 starts" in lines[0] and "PSS" not in lines[0]
    assert lines[1].startswith("one   old") and "1 starts" in lines[1]
    assert lines[2].startswith("split new") and "PSS 675.00 MiB (650.00-700.00)" in lines[2]
    assert lines[2].endswith("serving again after SIGKILL 2.00 s (1.50-2.50)")


def test_an_unknown_layout_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "rows.json"), "--layouts", "one,three"])
    assert not (tmp_path / "rows.json").exists()
