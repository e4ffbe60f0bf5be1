"""Pacing a stream at a rate (``clients.pacing``)."""

from __future__ import annotations

import pytest

from livefit.clients.pacing import RatePacer


def test_rate_pacer_schedules_against_the_start() -> None:
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds + 0.003  # every sleep overshoots; the schedule must absorb it

    pacer = RatePacer(1000.0, clock=lambda: now[0], sleep=sleep)
    for sent in range(0, 500, 50):  # messages of 50 samples
        pacer.wait(sent)
    assert sleeps[0] == pytest.approx(0.05)
    assert now[0] == pytest.approx(100.45 + 0.003)  # the last message is due at 450 / 1000 s
