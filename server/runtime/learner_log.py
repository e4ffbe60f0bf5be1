"""The learner's write-ahead log around its models (``LearnerLog``, which ``LearnerRuntime``
owns): made in the storage directory, opened past what the restored models trained, replayed
at start (what was accepted but not yet checkpointed), truncated after each checkpoint, marked
lost when the storage directory is, closed last.

This module owns those steps; the log itself is ``storage.wal``'s and when they run is
``learner``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.metrics import Metrics
from ..config.sections import StorageSettings
from ..ingest.route import Route
from ..storage.checkpoint import Checkpoint
from ..storage.metrics import WalMetrics
from ..storage.wal import WriteAheadLog
from ..wire.codec import decode_message
from ..wire.rejection import Rejection

if TYPE_CHECKING:
    from .learner import ModelRuntime

log = logging.getLogger(__name__)


class LearnerLog:
    """The write-ahead log all of a learner's ``models`` share (``wal``: None without one)."""

    def __init__(self, models: Mapping[str, ModelRuntime], metrics: Metrics) -> None:
        self.models = models
        self.metrics = metrics
        self.wal: WriteAheadLog | None = None

    def create(self, storage: StorageSettings) -> None:
        """Make the log in the storage directory, not yet open (none with ``storage.wal`` off)."""
        if storage.wal:
            self.wal = WriteAheadLog(
                Path(storage.dir) / "wal", storage.wal_segment_bytes, storage.fsync
            )

    def open(self) -> None:
        """Open the log to append past every position the restored models trained."""
        if self.wal is not None:
            restored = [m.trainer.trained_position for m in self.models.values() if m.trainer]
            self.wal.open(start_after=max(restored, default=0))

    def replay(self, routes: list[Route]) -> None:
        """Queue what was accepted (and acknowledged) before a crash but not yet checkpointed."""
        if self.wal is None:
            return
        self._report_lost_positions()
        by_model = {route.model: route for route in routes}
        replayed: dict[str, int] = {}
        for record in self.wal.replay():
            route = by_model.get(record.model)
            runtime = self.models.get(record.model)
            if route is None or runtime is None or runtime.trainer is None:
                continue
            if record.position <= runtime.trainer.trained_position:
                continue
            if route.labels is not None and route.labels.owns_record(record):
                chunk = route.labels.replay(record)
                if chunk is not None:
                    route.queue.put(chunk)
                continue
            try:
                decoded = decode_message(record.payload, route.spec, record.content_type)
            except Rejection as exc:  # the model's shapes changed since: cannot train on it
                log.warning(
                    "log record %d no longer fits %s: %s", record.position, record.model, exc
                )
                continue
            tracker = route.sequences
            if tracker is not None and decoded.source is not None and decoded.seq is not None:
                # Logged records were de-duplicated before they were logged: replay them all.
                # (The checkpoint's dedup state already holds them; skipping would lose them.)
                tracker.check(decoded.source, decoded.seq)
                tracker.commit()
            chunk = decoded.chunk
            route.queue.put(replace(chunk, position=record.position))
            replayed[record.model] = replayed.get(record.model, 0) + len(chunk)
            self.metrics.group(WalMetrics).wal_replayed_samples.labels(model=record.model).inc(
                len(chunk)
            )
        for route in routes:
            for chunk in route.labels.leftover() if route.labels is not None else ():
                route.queue.put(chunk)
        for model, count in replayed.items():
            log.info("replayed %d samples of %s from the write-ahead log", count, model)
        skipped = sum(s.records for s in self.wal.skipped)  # each logged by the log with its byte
        if skipped:
            self.metrics.group(WalMetrics).wal_corrupt_records.inc(skipped)
            log.error(
                "write-ahead log: %d corrupt record(s) skipped, the rest replayed "
                "(livefit_wal_corrupt_records_total)", skipped,
            )  # fmt: skip

    def _report_lost_positions(self) -> None:
        """Say (an error, a metric) when a model's restore position is below the log's first
        position: its kept checkpoints were damaged or gone, and what the log held between is
        lost. Never silent. A model without any history (version 0) has nothing to lose."""
        assert self.wal is not None
        first = self.wal.first_position
        for name, runtime in self.models.items():
            trainer = runtime.trainer
            if trainer is None or trainer.version == 0 or first <= trainer.trained_position + 1:
                continue
            restored = trainer.restored_from
            source = f"checkpoint v{restored.version}" if restored else "no usable checkpoint"
            lost = first - 1 - trainer.trained_position
            self.metrics.group(WalMetrics).wal_lost_positions.labels(model=name).inc(lost)
            log.error(
                "%s: restored to write-ahead-log position %d (%s) but the log starts at %d: "
                "positions %d to %d were truncated behind checkpoints now damaged or gone, and "
                "the acknowledged samples of %s among them are lost "
                "(livefit_wal_lost_positions_total)",
                name, trainer.trained_position, source, first, trainer.trained_position + 1,
                first - 1, name,
            )  # fmt: skip

    def truncate(self, checkpoint: Checkpoint) -> None:
        """After a checkpoint, drop log segments that every model's oldest kept checkpoint
        (``Trainer.log_needed_from``) is past."""
        if self.wal is None:
            return
        frontiers = [
            m.trainer.log_needed_from for m in self.models.values() if m.trainer is not None
        ]
        removed = self.wal.truncate(min(frontiers, default=0))
        if removed:
            log.info("write-ahead log: %d old segments removed", removed)

    def frontier(self, model: str, trained: int) -> int:
        """The log position ``model`` needs nothing before, having trained through ``trained``
        (``WriteAheadLog.frontier``; 0 without a log)."""
        return self.wal.frontier(model, trained) if self.wal is not None else 0

    def mark_lost(self, reason: str) -> None:
        """The storage directory was deleted or replaced (``storage.watch``): the log takes
        nothing more."""
        if self.wal is not None:
            self.wal.mark_lost(reason)

    def close(self) -> None:
        """Commit what is buffered and close; nothing is logged or truncated after this."""
        if self.wal is not None:
            self.wal.close()
            self.wal = None
