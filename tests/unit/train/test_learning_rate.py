"""``LearningRate`` on a real compiled step: the start boost decays to the configured rate, a
drift boost holds or decays, ending a boost restores the rate, and a saved point rewinds it."""

from __future__ import annotations

import pytest

from livefit.server.train.learning_rate import LearningRate, LrBoost
from tests.unit.train.test_step_graph import step_of

RATE = 0.01


def test_a_constant_boost_holds_its_peak_then_ends() -> None:
    boost = LrBoost(peak=3.0, steps=2, decays=False)
    assert boost.factor() == 3.0
    boost.left = 0
    assert boost.factor() == 1.0


def test_a_decaying_boost_falls_linearly_towards_one() -> None:
    boost = LrBoost(peak=3.0, steps=4, decays=True)
    factors = []
    for _ in range(5):
        factors.append(boost.factor())
        boost.left -= 1
    assert factors == pytest.approx([3.0, 2.5, 2.0, 1.5, 1.0])


def test_a_fresh_model_starts_boosted_and_steps_down_to_the_configured_rate() -> None:
    step = step_of(learning_rate=RATE)
    rate = LearningRate(step, start_factor=2.0, start_steps=2)
    assert rate.base == pytest.approx(RATE)
    seen = [rate.current]
    for _ in range(3):
        rate.after_step()
        seen.append(rate.current)
    assert seen == pytest.approx([2 * RATE, 1.5 * RATE, RATE, RATE])
    assert rate.factor == 1.0


def test_ending_a_boost_restores_the_rate_at_once() -> None:
    rate = LearningRate(step_of(learning_rate=RATE), start_factor=4.0, start_steps=100)
    assert rate.current == pytest.approx(4 * RATE)
    rate.end_boost()
    assert rate.current == pytest.approx(RATE) and rate.factor == 1.0


def test_a_point_rewinds_the_boost_and_the_rate() -> None:
    rate = LearningRate(step_of(learning_rate=RATE))
    rate.start_boost(3.0, 2, decays=False)
    point = rate.point()
    rate.after_step()
    rate.after_step()
    assert rate.current == pytest.approx(RATE)
    rate.restore_point(point)
    assert rate.current == pytest.approx(3 * RATE) and rate.boost.left == 2
