"""Time that a wall-clock step cannot bend, and the check on times other processes stamp.

``SteadyClock`` gives epoch seconds for times a process logs or compares across restarts: the
wall clock is read once, then the time advances with the monotonic clock only, and never falls
behind a floor the caller gives (the newest time it has already logged). An NTP step or an
operator's ``date -s`` changes neither its rate nor its order.

A time stamped by another process (a prediction record's serving time, a snapshot's creation
time) is that process's clock: ``ahead_s`` says how far it is ahead of this one, beyond
``AHEAD_TOLERANCE_S``, so that the caller clamps it, counts it (``metrics.ClockMetrics``) and
logs it, instead of reading a negative duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable

AHEAD_TOLERANCE_S = 5.0  # a time this far ahead of ours is a clock fault, not jitter


class SteadyClock:
    """Epoch seconds: the wall clock read at the first call, then advanced monotonically."""

    def __init__(
        self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._anchor: tuple[float, float] | None = None  # (epoch seconds, monotonic seconds)

    def now(self, floor: float = 0.0) -> float:
        """The time now, never before ``floor``; from there on it goes on from ``floor``."""
        mono = self._monotonic()
        if self._anchor is None:
            self._anchor = (max(self._wall(), floor), mono)
        start, since = self._anchor
        now = start + (mono - since)
        if now < floor:
            self._anchor = (floor, mono)
            return floor
        return now


def ahead_s(stamped: float, now: float) -> float:
    """How far ``stamped`` (another process's time) is ahead of ``now`` beyond the tolerance;
    0.0 when it is not."""
    ahead = stamped - now
    return ahead if ahead > AHEAD_TOLERANCE_S else 0.0
