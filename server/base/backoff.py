"""When to try again something that keeps failing, without a thread of its own (``Backoff``).

The owner asks ``due()`` from its own loop and reports each outcome: after the n-th failure in
a row the next try waits ``first_s * 2 ** (n - 1)``, at most ``max_s``; a success ends the
waits. So something that works again is noticed within ``max_s`` (plus the try itself), and
something that keeps failing costs one try per ``max_s``. Monotonic time; one owner thread.
"""

from __future__ import annotations

import time


class Backoff:
    """Doubling waits between tries of something failing; none while it works."""

    def __init__(self, first_s: float = 0.5, max_s: float = 5.0) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"need 0 < first_s <= max_s, got {first_s} and {max_s}")
        self.first_s, self.max_s = first_s, max_s
        self.failures = 0  # in a row
        self._next_at = 0.0

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def due(self) -> bool:
        """Whether a try is due now: always while it works, else once its wait is over."""
        return time.monotonic() >= self._next_at

    def failed(self) -> None:
        """A try failed (or was made while failing, its outcome to come): the next one waits
        twice as long as the last wait, ``max_s`` at most."""
        self.failures += 1
        wait = min(self.max_s, self.first_s * 2.0 ** min(self.failures - 1, 60))
        self._next_at = time.monotonic() + wait

    def succeeded(self) -> None:
        self.failures = 0
        self._next_at = 0.0
