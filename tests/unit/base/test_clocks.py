"""``SteadyClock``: epoch seconds a wall-clock step cannot bend, never behind a floor."""

from __future__ import annotations

from livefit.server.base.clocks import AHEAD_TOLERANCE_S, SteadyClock, ahead_s


class Clocks:
    """A wall clock and a monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_000_000.0, 50.0

    def clock(self) -> SteadyClock:
        return SteadyClock(lambda: self.wall, lambda: self.mono)


def test_a_wall_clock_step_changes_nothing() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    assert clock.now() == 1_000_000.0
    clocks.wall += 3600  # stepped: an NTP correction, `date -s`
    clocks.mono += 2
    assert clock.now() == 1_000_002.0
    clocks.wall -= 7200
    clocks.mono += 1
    assert clock.now() == 1_000_003.0


def test_never_behind_the_floor_and_going_on_from_it() -> None:
    """After a restart with the wall clock behind the newest logged time, the clock starts at
    that time and advances from there, instead of standing still until the wall catches up."""
    clocks = Clocks()
    clock = clocks.clock()
    logged = clocks.wall + 3600
    assert clock.now(logged) == logged
    clocks.mono += 5
    assert clock.now(logged) == logged + 5
    assert clock.now(logged + 10) == logged + 10
    clocks.mono += 1
    assert clock.now() == logged + 11


def test_ahead_beyond_the_tolerance_only() -> None:
    assert ahead_s(100.0 + AHEAD_TOLERANCE_S, 100.0) == 0.0
    assert ahead_s(100.0 - 3600, 100.0) == 0.0
    assert ahead_s(1e11, 100.0) == 1e11 - 100.0
