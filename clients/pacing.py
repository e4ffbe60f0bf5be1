"""Pacing a sample stream: the chunks a publisher reads (``Chunks``), their slicing into
messages of ``batch`` samples (``split_messages``), and ``RatePacer``, which holds a stream to a
rate in samples per second without letting sleep overshoot add up.

Owns no connection and no I/O; ``publisher`` and ``delayed`` use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

Chunks = Iterable[tuple[np.ndarray, np.ndarray]]


class RatePacer:
    """Holds a stream to ``rate`` samples/s on average.

    Each message is due at start + samples_before_it / rate, so sleep overshoot never adds up.
    """

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 samples/s, got {rate}")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None

    def wait(self, samples_sent: int) -> None:
        """Block until the message that follows ``samples_sent`` samples is due."""
        now = self._clock()
        if self._start is None:
            self._start = now
        delay = self._start + samples_sent / self.rate - now
        if delay > 0:
            self._sleep(delay)


def split_messages(chunks: Chunks, batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The (x, y) of each message: every chunk cut into runs of ``batch`` samples (the last of
    a chunk may be shorter; a message never spans two chunks). ValueError on a chunk whose x
    and y differ in length."""
    for x, y in chunks:
        if len(x) != len(y):
            raise ValueError(f"a chunk has {len(x)} inputs but {len(y)} targets")
        for start in range(0, len(x), batch):
            yield x[start : start + batch], y[start : start + batch]
