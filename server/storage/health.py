"""Whether livefit's storage takes writes, and logging that cannot flood the disk it watches.

Every storage operation that can fail (write-ahead-log open, write and fsync; checkpoint writes;
the version high-water mark) reports here. A failure is counted
(``livefit_storage_errors_total{op}``), makes readiness fail (``/v2/health/ready`` names the
operation and the error) and is logged: the first failure of an operation at once, then one
summary line per ``log_interval_s`` at most while it keeps failing, and one line when it works
again. A full disk produced 63,354 tracebacks in 60 s before this existed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ..base.metrics import Metrics
from .metrics import StorageMetrics

log = logging.getLogger(__name__)


@dataclass
class _Failing:
    since: float
    last_error: str
    errors: int = 1
    logged_at: float = 0.0
    logged_errors: int = 1


class StorageHealth:
    """Failing storage operations by name; thread-safe."""

    def __init__(self, metrics: Metrics, log_interval_s: float = 10.0) -> None:
        self.metrics = metrics
        metrics.group(StorageMetrics)
        self.log_interval_s = log_interval_s
        self._failing: dict[str, _Failing] = {}
        self._lock = threading.Lock()

    def failed(self, op: str, error: BaseException) -> None:
        """Count a failure of ``op`` and log it with back-off."""
        now = time.monotonic()
        text = _describe(error)
        self.metrics.group(StorageMetrics).storage_errors.labels(op=op).inc()
        with self._lock:
            state = self._failing.get(op)
            if state is None:
                self._failing[op] = _Failing(since=now, last_error=text, logged_at=now)
                self.metrics.group(StorageMetrics).storage_healthy.set(0)
                log.error("storage: %s failed: %s (retrying; acknowledgements held)", op, text)
                return
            state.errors += 1
            state.last_error = text
            if now - state.logged_at < self.log_interval_s:
                return
            log.error(
                "storage: %s still failing after %.0f s (%d errors since the last line): %s",
                op, now - state.since, state.errors - state.logged_errors, text,
            )  # fmt: skip
            state.logged_at, state.logged_errors = now, state.errors

    def recovered(self, op: str) -> None:
        """``op`` worked: clear its failure (one log line if it was failing)."""
        if op not in self._failing:  # cheap check first: this runs on every commit
            return
        with self._lock:
            state = self._failing.pop(op, None)
            if not self._failing:
                self.metrics.group(StorageMetrics).storage_healthy.set(1)
        if state is not None:
            log.warning(
                "storage: %s works again after %.1f s and %d errors",
                op, time.monotonic() - state.since, state.errors,
            )  # fmt: skip

    @property
    def healthy(self) -> bool:
        return not self._failing

    def problems(self) -> list[str]:
        """One line per failing operation, for readiness and the dashboard."""
        with self._lock:
            return [
                f"storage {op} failing for {time.monotonic() - s.since:.0f} s: {s.last_error}"
                for op, s in sorted(self._failing.items())
            ]


class LogLimiter:
    """Allows one log line per key per ``interval_s`` and counts the ones it held back."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last: dict[object, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def allow(self, key: object) -> int | None:
        """None when this line should be suppressed; else how many were suppressed before it."""
        now = time.monotonic()
        with self._lock:
            last, held_back = self._last.get(key, (-1e18, 0))
            if now - last < self.interval_s:
                self._last[key] = (last, held_back + 1)
                return None
            if len(self._last) > 10_000:  # keys are bounded labels; this is a safety net
                self._last.clear()
            self._last[key] = (now, 0)
            return held_back


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 300 else text[:300] + "..."
