"""The learner's write-ahead log around its models: replay at start of what was accepted but
not yet checkpointed (``LearnerLog``, which ``LearnerRuntime`` inherits), truncation after each
checkpoint, and the removal of temporary files an interrupted write left.

This module owns those steps; the log itself is ``storage.wal``'s and when they run is
``runtime``'s.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.metrics import Metrics
from ..ingest.route import Route
from ..storage.checkpoint import Checkpoint
from ..storage.metrics import WalMetrics
from ..storage.wal import WriteAheadLog
from ..wire.codec import decode_message
from ..wire.rejection import Rejection

if TYPE_CHECKING:
    from .learner_models import ModelRuntime

log = logging.getLogger(__name__)


class LearnerLog:
    """The write-ahead-log half of ``LearnerRuntime``."""

    # kept by LearnerRuntime (and ProcessRuntime)
    metrics: Metrics
    wal: WriteAheadLog | None
    models: dict[str, ModelRuntime]

    def _replay(self, routes: list[Route]) -> None:
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

    def _truncate_log(self, checkpoint: Checkpoint) -> None:
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


def _remove_temporary_files(storage: Path) -> None:
    """Delete what an interrupted atomic write left (``*.tmp`` beside checkpoints and marks):
    only whole files are ever renamed into place, so nothing else reads them."""
    removed = 0
    for leftover in (storage / "checkpoints").glob("*/*.tmp"):
        leftover.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info("removed %d temporary files left by an interrupted write", removed)
