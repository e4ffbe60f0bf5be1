"""Log lines about a stream of versions without flooding the log (``VersionLog``): the learner's
published weights and the versions a replica serves."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

SUMMARY_INTERVAL_S = 30.0  # at INFO, one line per this long about the versions that went by


class VersionLog:
    """Logs a stream of versions (several a second) without flooding the log.

    Every version is logged at DEBUG. At INFO: the first one at once, then one summary line
    per ``interval_s`` with the count and the version range (written when the next version
    comes after the interval, or on ``flush``).
    """

    def __init__(
        self,
        logger: logging.Logger,
        subject: str,
        verb: str,
        interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.subject, self.verb = logger, subject, verb
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the last INFO line was written
        self._count = 0
        self._low = self._high = 0
        self._detail = ""

    def record(self, version: int, message: str, detail: str = "") -> None:
        """One new ``version``: ``message`` is its own line, ``detail`` goes in summaries."""
        self.logger.debug("%s", message)
        with self._lock:
            now = self._clock()
            if self._since is None:
                self._since = now
                line: str | None = message
            else:
                self._add(version, detail)
                line = self._take(now) if now - self._since >= self.interval_s else None
        if line is not None:
            self.logger.info("%s", line)

    def flush(self) -> None:
        """Write the summary of what was not summarised yet (at shutdown)."""
        with self._lock:
            line = self._take(self._clock()) if self._count else None
        if line is not None:
            self.logger.info("%s", line)

    def _add(self, version: int, detail: str) -> None:
        if self._count == 0:
            self._low = self._high = version
        self._low, self._high = min(self._low, version), max(self._high, version)
        self._count += 1
        self._detail = detail

    def _take(self, now: float) -> str:
        seconds = now - (self._since if self._since is not None else now)
        versions = "version" if self._count == 1 else "versions"
        line = (
            f"{self.subject}: {self._count} {versions} {self.verb} in the last {seconds:.0f} s "
            f"(v{self._low} to v{self._high}{self._detail})"
        )
        self._since, self._count, self._detail = now, 0, ""
        return line
