"""The tables of a model's settings (``config.model_tables``): what each value may be."""

from __future__ import annotations

import pytest

from livefit.server.config.model_tables import ServeSettings


def test_the_setting_accepts_auto_and_numbers_only() -> None:
    assert ServeSettings(batch_timeout_ms="auto").batch_timeout_ms == "auto"
    assert ServeSettings(batch_timeout_ms="5").batch_timeout_ms == 5.0
    for bad in (-1, 10_001, "soon", float("nan")):
        with pytest.raises(ValueError, match="batch_timeout_ms"):
            ServeSettings(batch_timeout_ms=bad)
