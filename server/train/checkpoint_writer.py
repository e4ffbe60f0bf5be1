"""Writes a trainer's checkpoints on a background thread (``CheckpointWriter``).

Owns the write and its outcome: the newest checkpoint offered wins, a failure of any kind (a
full disk, or anything else, e.g. a state the format refuses) is storage trouble: counted,
logged (never raised) and reported to ``StorageHealth`` (readiness 503,
``livefit_storage_healthy`` 0) until a checkpoint is written again (the trainer offers one
again on a back-off, at the same version too); the ``on_written`` callbacks run only once a
checkpoint is on disk. Writes never overlap: the trainer's own ``write`` (a final checkpoint)
waits for one the thread is writing (of the same version, maybe: both would write one
temporary file).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..base.latest_worker import LatestWorker
from ..base.metrics import Metrics
from ..storage.checkpoint import Checkpoint, CheckpointStore
from ..storage.health import StorageHealth
from .metrics import CheckpointMetrics

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Writes checkpoints on its own thread; the newest offered wins, older pending ones drop."""

    def __init__(
        self, name: str, store: CheckpointStore, metrics: Metrics, storage: StorageHealth
    ) -> None:
        self.name = name
        self.store = store
        self.metrics = metrics
        self.storage = storage
        self.on_written: list[Callable[[Checkpoint], None]] = []
        self.failure: str | None = None  # why the last checkpoint failed; None once one works
        self._writing = threading.Lock()
        self._worker: LatestWorker[Checkpoint] = LatestWorker(f"checkpoint-{name}", self.write)

    def start(self) -> None:
        self._worker.start()

    def offer(self, checkpoint: Checkpoint) -> None:
        self._worker.offer(checkpoint)

    def stop(self, timeout: float = 30.0) -> None:
        self._worker.stop(timeout)

    def write(self, checkpoint: Checkpoint) -> None:
        """Write now, on the caller's thread; failures are counted and logged, never raised."""
        with self._writing:
            self._write(checkpoint)

    def _write(self, checkpoint: Checkpoint) -> None:
        started = time.perf_counter()
        try:
            path = self.store.write(checkpoint)
        except Exception as exc:  # full or read-only disk, or anything else: storage trouble
            self.metrics.group(CheckpointMetrics).checkpoints.labels(
                model=self.name, outcome="failed"
            ).inc()
            if not isinstance(exc, OSError) and self.failure is None:  # a bug? its traceback once
                log.exception("checkpoint of %s v%d failed", self.name, checkpoint.version)
            self.failure = f"v{checkpoint.version}: {type(exc).__name__}: {exc}"[:300]
            self.storage.failed("checkpoint", exc)
            return
        self.failure = None
        self.storage.recovered("checkpoint")
        self.metrics.group(CheckpointMetrics).checkpoints.labels(
            model=self.name, outcome="ok"
        ).inc()
        self.metrics.group(CheckpointMetrics).checkpoint_seconds.labels(model=self.name).observe(
            time.perf_counter() - started
        )
        self.metrics.group(CheckpointMetrics).checkpoint_bytes.labels(model=self.name).set(
            path.stat().st_size
        )
        log.info("checkpoint %s v%d written (log position %d)", self.name, checkpoint.version,
                 checkpoint.position)  # fmt: skip
        for callback in self.on_written:
            try:
                callback(checkpoint)
            except Exception:
                log.exception("after-checkpoint callback failed for %s", self.name)
