"""What learning a batch did, counted (``Accounting``), and how far the model has come
(``Progress``).

A batch learned moves the ``Progress`` (version, samples, the log position trained), adds to
the prequential scores and updates this model's training metrics. An operator hears of what is
rare or wrong: a step rolled back (non-finite), clipped outlying targets (at most once a minute),
a new level of the targets, concept drift (reported once its batch is counted) and, with online
model selection, a switch of the served candidate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.metrics import Metrics
from ..ingest.metrics import SampleQueueMetrics
from ..ingest.sample_queue import SampleQueue
from ..wire.samples import Batch
from .hooks import TrainerHooks
from .metrics import SelectionMetrics, TrainingMetrics, TrainingStateMetrics
from .prequential import PrequentialScores
from .scaling import LevelShift
from .selection import CandidateSet
from .train_step import TrainStep
from .update_policy import Learned, UpdatePolicy

log = logging.getLogger(__name__)
_OUTLIER_LOG_INTERVAL_S = 60.0


@dataclass(slots=True)
class Progress:
    """How far a trainer's model has come: restored at a start (``Checkpointing``), advanced by
    each batch learned (``Accounting``), carried by every snapshot and checkpoint."""

    lineage: str  # the history its versions count in
    version: int = 0  # a version per step applied
    samples_seen: int = 0
    trained_position: int = 0  # WAL position of the last message fully trained
    newest_published_at: float | None = None  # the newest publish time of a sample learned


class Accounting:
    """Counts what each batch of model ``name`` did: its ``progress``, its ``scores``, its
    metrics and logs; with ``candidates``, serves the best one after each batch."""

    def __init__(
        self,
        name: str,
        progress: Progress,
        scores: PrequentialScores,
        policy: UpdatePolicy,
        candidates: CandidateSet | None,
        queue: SampleQueue,
        hooks: TrainerHooks,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.progress = progress
        self.scores = scores
        self.policy = policy
        self.step: TrainStep = policy.step
        self.candidates = candidates
        self.queue = queue
        self.hooks = hooks
        self.metrics = metrics
        self._outliers_logged_at = -_OUTLIER_LOG_INTERVAL_S
        self._series: dict[str, Any] | None = None  # labelled metric series, see _record
        # A drift found during a step is reported once the step is counted, so that the
        # event's samples_seen includes the batch that showed it.
        self._drift_found: int | None = None
        if candidates is not None:
            self._record_selection()

    def found_drift(self, detections: int) -> None:
        """Drift was found during the step now running (``UpdatePolicy.on_drift``): reported
        once its batch is counted."""
        self._drift_found = detections

    def account(self, batch: Batch, learned: Learned, elapsed: float) -> None:
        """What learning ``batch`` did, counted: versions, samples, scores, metrics, logs."""
        result = learned.first
        progress = self.progress
        if batch.position is not None:
            progress.trained_position = batch.position
        if learned.shift is not None:
            self._report_shift(learned.shift)
        if learned.outliers:
            self._count_outliers(learned.outliers)
        if not result.applied:
            self.metrics.group(TrainingMetrics).train_nonfinite.labels(model=self.name).inc()
            log.warning(
                "%s: a batch of %d gave a non-finite loss or weights (loss %s); step rolled back",
                self.name, len(batch), result.loss,
            )  # fmt: skip
            return
        scored_by = progress.version
        progress.version += learned.steps
        progress.samples_seen += len(batch)
        if self._drift_found is not None:
            detections, self._drift_found = self._drift_found, None
            self.hooks.drift_detected(detections)
        if batch.newest_published_at is not None:
            progress.newest_published_at = max(
                batch.newest_published_at, progress.newest_published_at or 0.0
            )
        self.scores.add(result.prequential_losses, learned.y, result.predictions)
        self._record(batch, learned, elapsed)
        if self.candidates is not None:
            self._select()
        self.hooks.batch_learned(batch, scored_by)

    def _select(self) -> None:
        """Serve the best candidate (with hysteresis); count, log and report a switch."""
        assert self.candidates is not None
        switch = self.candidates.reconsider()
        self._record_selection()
        if switch is None:
            return
        version = self.progress.version
        self.metrics.group(SelectionMetrics).selection_switches.labels(model=self.name).inc()
        log.info(
            "%s: serving candidate %s instead of %s from v%d (windowed prequential loss %s; "
            "livefit_selection_switches_total)",
            self.name, switch.new, switch.old, version,
            ", ".join(f"{n} {v:.6g}" for n, v in switch.scores.items()),
        )  # fmt: skip
        self.hooks.selection_switched(switch, version)

    def _record_selection(self) -> None:
        assert self.candidates is not None
        m = self.metrics.group(SelectionMetrics)
        served = self.candidates.served.name
        for candidate, score in self.candidates.scores().items():
            m.selection_score.labels(model=self.name, candidate=candidate).set(score)
            m.selection_served.labels(model=self.name, candidate=candidate).set(candidate == served)

    def _report_shift(self, shift: LevelShift) -> None:
        """Count and log a change of level of the targets (rare: not rate-limited)."""
        self.metrics.group(TrainingMetrics).train_target_shifts.labels(model=self.name).inc()
        log.warning(
            "%s: %d recent targets lay beyond the outlier bound on one side: a new level, not "
            "outliers; target statistics re-centred on them (features %s, mean %s, std %s), "
            "replay buffer emptied (livefit_train_target_shifts_total)",
            self.name, shift.count, shift.features.tolist(), shift.mean.tolist(),
            np.sqrt(shift.variance).tolist(),
        )  # fmt: skip

    def _count_outliers(self, samples: int) -> None:
        """Count clipped targets; say so in the log at most once a minute."""
        self.metrics.group(TrainingMetrics).train_outliers.labels(model=self.name).inc(samples)
        now = time.monotonic()
        if now - self._outliers_logged_at < _OUTLIER_LOG_INTERVAL_S:
            return
        self._outliers_logged_at = now
        scaler = self.policy.scaling.target_scaler
        bounds = None if scaler is None else scaler.bounds(self.policy.scaling.target_outlier_std)
        low, high = ("?", "?") if bounds is None else (bounds[0].tolist(), bounds[1].tolist())
        log.warning(
            "%s: %d sample(s) with a target beyond %g standard deviations of the running "
            "target statistics (range %s to %s) were clipped to it and not learned "
            "(livefit_train_outliers_total; train.target_outlier_std)",
            self.name, samples, self.policy.scaling.target_outlier_std, low, high,
        )  # fmt: skip

    def _record(self, batch: Batch, learned: Learned, elapsed: float) -> None:
        series = self._series or self._labelled_series()
        series["steps"].inc(learned.steps)
        series["samples"].inc(len(batch))
        series["batch_size"].observe(len(batch))
        series["batch_seconds"].observe(elapsed)
        series["step_seconds"].observe(elapsed)  # the deprecated alias
        series["loss"].set(learned.first.loss)
        scores = self.scores.scores
        series["prequential_loss"].set(scores["loss"].value)
        if "accuracy" in scores:
            series["prequential_accuracy"].set(scores["accuracy"].value)
        for metric, mean in scores.items():
            series[f"sliding {metric}"].set(mean.value)
            series[f"cumulative {metric}"].set(mean.cumulative)
        if learned.replayed:
            state = self.metrics.group(TrainingStateMetrics)
            state.replayed_samples.labels(model=self.name).inc(learned.replayed)
        if self.policy.replay is not None:
            series["replay_fill"].set(self.policy.replay.fill_ratio)
        series["version"].set(self.progress.version)
        series["model_samples"].set(self.progress.samples_seen)
        series["queue_depth"].set(len(self.queue))
        first = learned.first
        if first.expert_shares is not None and first.expert_errors is not None:
            for expert, share, error in zip(
                self.step.experts or (), first.expert_shares, first.expert_errors, strict=True
            ):
                series[f"expert_weight {expert}"].set(share)
                series[f"expert_error {expert}"].set(error)

    def _labelled_series(self) -> dict[str, Any]:
        """This model's series that ``_record`` updates every batch, looked up once
        (``labels()`` takes a lock and a dict lookup: 16 a batch cost about 30 us)."""
        m, name = self.metrics.group(TrainingMetrics), self.name
        state = self.metrics.group(TrainingStateMetrics)
        queue = self.metrics.group(SampleQueueMetrics)
        series: dict[str, Any] = {
            "steps": m.train_steps.labels(model=name),
            "samples": m.train_samples.labels(model=name),
            "batch_size": m.train_batch_size.labels(model=name),
            "batch_seconds": m.train_batch_seconds.labels(model=name),
            "step_seconds": m.train_step_seconds.labels(model=name),
            "loss": m.train_loss.labels(model=name),
            "prequential_loss": m.prequential_loss.labels(model=name),
            "version": state.model_version.labels(model=name),
            "model_samples": state.model_samples.labels(model=name),
            "queue_depth": queue.queue_depth.labels(model=name),
        }
        # Only the series the model has (created on first use, as before).
        if "accuracy" in self.scores.scores:
            series["prequential_accuracy"] = m.prequential_accuracy.labels(model=name)
        if self.policy.replay is not None:
            series["replay_fill"] = state.replay_fill.labels(model=name)
        for expert in self.step.experts or ():
            series[f"expert_weight {expert}"] = m.expert_weight.labels(model=name, expert=expert)
            series[f"expert_error {expert}"] = m.expert_error.labels(model=name, expert=expert)
        for metric in self.scores.scores:
            for window in ("sliding", "cumulative"):
                series[f"{window} {metric}"] = m.prequential_score.labels(
                    model=name, metric=metric, window=window
                )
        self._series = series
        return series
