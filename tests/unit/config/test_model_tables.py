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


def test_the_guard_is_off_and_on_only_with_a_reference_set_until_the_shadow_side_starts() -> None:
    assert GuardSettings().enabled is False and GuardSettings().margin == 0.1
    with pytest.raises(ValueError, match=r"needs guard\.reference_path"):
        GuardSettings(enabled=True)
    assert GuardSettings(enabled=True, reference_path="ref.csv").enabled
    assert GuardSettings(reference_path="ref.csv").enabled is False
