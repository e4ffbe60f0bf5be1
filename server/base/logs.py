"""Logging setup: plain lines for people, one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

# Set by a worker group for each serving worker (server/runtime/workers.py), and for a split
# learner's training process (learner_group.py): its lines say which process wrote them.
WORKER_ENV = "LIVEFIT_WORKER_INDEX"
TRAINING_ENV = "LIVEFIT_TRAINING_DIR"


def process_label() -> str | None:
    """``"0"``, ``"1"``... for a serving worker, ``"training"`` for a split learner's training
    process, None for a process on its own."""
    if os.environ.get(TRAINING_ENV):
        return "training"
    return os.environ.get(WORKER_ENV)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        worker = process_label()
        if worker is not None:
            entry["worker"] = int(worker) if worker.isdigit() else worker
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str | int = "INFO", json_format: bool = False) -> None:
    """Configure the root logger once for the process."""
    handler = logging.StreamHandler()
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        worker = process_label()
        who = f" [worker {worker}]" if worker is not None else ""
        who = " [training]" if worker == "training" else who
        formatter = logging.Formatter(f"%(asctime)s %(levelname)s{who} %(name)s: %(message)s")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def current_logging() -> tuple[int, bool]:
    """This process's root logging as ``configure_logging`` left it: its level (a number: a
    level without a name passes too) and whether it writes JSON (what a helper process it
    starts is told to log as)."""
    root = logging.getLogger()
    json_format = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return root.level, json_format


class LogThrottle:
    """The first line of a kind, then at most one per ``gap_s`` saying how many were held back:
    for a condition that can repeat many times a second (someone else's messages on a topic).
    Thread-safe."""

    def __init__(self, gap_s: float = 60.0) -> None:
        self.gap_s = gap_s
        self._lock = threading.Lock()
        self._logged_at = -float("inf")
        self._held = 0

    def allow(self) -> str | None:
        """None: hold this line back (counted). Otherwise log it now, with the returned suffix
        (``" (N more since the last line)"``, or empty)."""
        now = time.monotonic()
        with self._lock:
            if now - self._logged_at < self.gap_s:
                self._held += 1
                return None
            held, self._held, self._logged_at = self._held, 0, now
        return f" ({held} more since the last line)" if held else ""
