"""The tables of a model's settings (``config.model_tables``): what each value may be."""

from __future__ import annotations

import pytest

from livefit.server.config.model_tables import GuardSettings, ServeSettings


def test_the_setting_accepts_auto_and_numbers_only() -> None:
    assert ServeSettings(batch_timeout_ms="auto").batch_timeout_ms == "auto"
    assert ServeSettings(batch_timeout_ms="5").batch_timeout_ms == 5.0
    for bad in (-1, 10_001, "soon", float("nan")):
        with pytest.raises(ValueError, match="batch_timeout_ms"):
            ServeSettings(batch_timeout_ms=bad)


def test_the_guard_is_off_and_refused_on_until_the_learner_starts_it() -> None:
    assert GuardSettings().enabled is False and GuardSettings().margin == 0.1
    with pytest.raises(ValueError, match="not started by the learner yet"):
        GuardSettings(enabled=True)
