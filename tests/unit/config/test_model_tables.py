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


def test_the_guard_is_off_by_default_and_on_with_or_without_a_reference_set() -> None:
    assert GuardSettings().enabled is False and GuardSettings().margin == 0.1
    assert GuardSettings(enabled=True).reference_path is None  # the shadow side
    assert GuardSettings(enabled=True, reference_path="ref.csv").enabled
    assert GuardSettings(reference_path="ref.csv").enabled is False
    for bad in ({"margin": -0.1}, {"margin": True}, {"window": 0}, {"held_long_s": 0}):
        with pytest.raises(ValueError):
            GuardSettings(**bad)
