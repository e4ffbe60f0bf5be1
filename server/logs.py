"""Logging setup: plain lines for people, one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import os
import time

# Set by a replica worker group for each worker (server/processes/workers.py): its lines say
# which worker wrote them.
WORKER_ENV = "LIVEFIT_WORKER_INDEX"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        worker = os.environ.get(WORKER_ENV)
        if worker is not None:
            entry["worker"] = int(worker)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "INFO", json_format: bool = False) -> None:
    """Configure the root logger once for the process."""
    handler = logging.StreamHandler()
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        worker = os.environ.get(WORKER_ENV)
        who = f" [worker {worker}]" if worker is not None else ""
        formatter = logging.Formatter(f"%(asctime)s %(levelname)s{who} %(name)s: %(message)s")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
