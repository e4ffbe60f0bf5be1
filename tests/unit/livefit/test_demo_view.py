"""The demo's verdict on learning (``has_learned``): a loss that fell, or one far under what
always predicting the targets' mean costs, which a fast machine reaches before the first
reading."""

from __future__ import annotations

from livefit.demo_view import has_learned


def test_a_loss_that_fell_is_learning() -> None:
    assert has_learned(0.5, 0.01, None)
    assert has_learned(0.5, 0.01, 0.52)


def test_a_loss_already_at_the_noise_floor_at_the_first_reading_is_learning() -> None:
    # the 2026-11-29 Quickstart walk: 0.00011 at the first reading and at the end, targets'
    # variance about 0.5; it said "no learning seen" and exited 1
    assert has_learned(0.00011, 0.00011, 0.52)


def test_a_loss_that_neither_fell_nor_beats_the_mean_is_not() -> None:
    assert not has_learned(0.4, 0.45, 0.5)
    assert not has_learned(0.4, 0.45, None)
    assert not has_learned(None, 0.45, 0.5)
    assert not has_learned(None, None, 0.5)
    assert not has_learned(0.5, None, 0.5)
