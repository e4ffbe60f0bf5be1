"""``Accounting`` of batches a real update policy learned: an applied batch moves the progress,
the scores and the series; a rolled-back one only the log position; drift is reported once its
batch is counted; clipped targets and level shifts are counted and logged."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.accounting import Accounting, Progress
from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.modeling import build_compiled, experts_rule, make_loss
from livefit.server.train.prequential import PrequentialScores
from livefit.server.train.scaling import LevelShift
from livefit.server.train.train_step import StepResult, TrainStep
from livefit.server.train.update_policy import Learned, UpdatePolicy
from livefit.server.wire.samples import Batch

SETTINGS: dict[str, Any] = {"builder": "linear", "input_shape": [2], "output_shape": [1],
                            "seed": 0}  # fmt: skip


def policy_of(rewindable: bool = False, **overrides: Any) -> UpdatePolicy:
    """A trainer's update policy on a fresh compiled step, as ``Trainer`` builds them."""
    settings = ModelSettings.model_validate({**SETTINGS, **overrides})
    model = build_compiled(settings, "/CPU:0")
    step = TrainStep(model, make_loss(settings), settings.input_shape,
                     settings.resolved_target_shape(), "/CPU:0",
                     weight_average=settings.train.weight_average, rewindable=rewindable,
                     experts=experts_rule(settings))  # fmt: skip
    step.warm_up()
    return UpdatePolicy(settings, step, seed=settings.seed)


def batch_of(rows: int, seed: int = 0, position: int | None = None,
             newest: float | None = None) -> Batch:  # fmt: skip
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 2)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0]]) + 0.5).astype(np.float32)
    return Batch(x, y, np.ones(rows, np.float32), 1, newest, newest, position)


class Drifts(TrainerHooks):
    """Records each drift report with the samples counted when it came, and each batch learned
    with the version that predicted it."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.reports: list[tuple[int, int]] = []
        self.learned: list[tuple[Batch, int]] = []

    def drift_detected(self, detections: int) -> None:
        self.reports.append((detections, self.progress.samples_seen))

    def batch_learned(self, batch: Batch, scored_by: int) -> None:
        self.learned.append((batch, scored_by))


def accounting(policy: UpdatePolicy) -> tuple[Accounting, Drifts, Metrics]:
    progress = Progress(lineage="l")
    hooks, metrics = Drifts(progress), Metrics()
    scores = PrequentialScores(100, classification=False, sparse=False)
    counted = Accounting("m", progress, scores, policy, None, SampleQueue(10), hooks, metrics)
    return counted, hooks, metrics


def sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"model": "m"})


def rolled_back(batch: Batch) -> Learned:
    rows = len(batch)
    nan = StepResult(math.nan, np.full(rows, math.nan), np.full((rows, 1), math.nan), False)
    return Learned(first=nan, steps=0, replayed=0, drift=False, y=batch.y)


def test_an_applied_batch_moves_the_progress_the_scores_and_the_series() -> None:
    policy = policy_of()
    counted, _, metrics = accounting(policy)
    first = batch_of(8, seed=1, position=12, newest=100.0)
    learned = policy.learn(first)
    counted.account(first, learned, 0.01)
    second = batch_of(4, seed=2, position=13, newest=50.0)  # published before the newest
    counted.account(second, policy.learn(second), 0.01)
    progress = counted.progress
    assert (progress.version, progress.samples_seen) == (2 * learned.steps, 12)
    assert progress.trained_position == 13 and progress.newest_published_at == 100.0
    assert counted.scores.scores["loss"].total_count == 12
    assert sample(metrics, "livefit_train_samples_total") == 12
    assert sample(metrics, "livefit_train_steps_total") == 2 * learned.steps
    assert sample(metrics, "livefit_model_version") == progress.version
    assert sample(metrics, "livefit_prequential_loss") == pytest.approx(
        counted.scores.scores["loss"].value
    )


def test_each_applied_batch_is_told_with_the_version_that_predicted_it() -> None:
    """The guard's shadow side compares that version with the last good one on the batch."""
    policy = policy_of()
    counted, hooks, _ = accounting(policy)
    first, failed, second = batch_of(8, seed=1), batch_of(4, seed=3), batch_of(4, seed=2)
    learned = policy.learn(first)
    counted.account(first, learned, 0.01)
    counted.account(failed, rolled_back(failed), 0.01)  # nothing learned: not told
    counted.account(second, policy.learn(second), 0.01)
    assert [(batch, version) for batch, version in hooks.learned] == [
        (first, 0),
        (second, learned.steps),
    ]


def test_a_rolled_back_batch_moves_only_the_log_position(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted, _, metrics = accounting(policy_of())
    batch = batch_of(4, position=7, newest=100.0)
    with caplog.at_level(logging.WARNING, logger="livefit.server.train.accounting"):
        counted.account(batch, rolled_back(batch), 0.01)
    progress = counted.progress
    assert (progress.version, progress.samples_seen, progress.trained_position) == (0, 0, 7)
    assert progress.newest_published_at is None
    assert counted.scores.scores["loss"].total_count == 0
    assert sample(metrics, "livefit_train_nonfinite_total") == 1
    assert sample(metrics, "livefit_train_samples_total") is None  # no series touched
    assert "step rolled back" in caplog.text


def test_drift_is_reported_once_the_batch_that_showed_it_is_counted() -> None:
    policy = policy_of()
    counted, hooks, _ = accounting(policy)
    counted.found_drift(1)  # during a step that then rolls back: held for the next one
    failed = batch_of(4, seed=1)
    counted.account(failed, rolled_back(failed), 0.01)
    assert hooks.reports == []
    batch = batch_of(6, seed=2)
    counted.account(batch, policy.learn(batch), 0.01)
    assert hooks.reports == [(1, 6)]  # its samples included
    counted.account(batch, policy.learn(batch), 0.01)
    assert hooks.reports == [(1, 6)]  # once


def test_clipped_targets_are_counted_each_time_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = policy_of()
    counted, _, metrics = accounting(policy)
    with caplog.at_level(logging.WARNING, logger="livefit.server.train.accounting"):
        for seed in range(3):
            batch = batch_of(4, seed=seed)
            counted.account(batch, replace(policy.learn(batch), outliers=2), 0.01)
    assert sample(metrics, "livefit_train_outliers_total") == 6
    clipped = [r.getMessage() for r in caplog.records if "were clipped" in r.getMessage()]
    assert len(clipped) == 1 and clipped[0].startswith("m: 2 sample(s) with a target beyond")


def test_a_new_level_of_the_targets_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = policy_of()
    counted, _, metrics = accounting(policy)
    shift = LevelShift(np.array([0]), np.array([1]), np.array([40.0]), np.array([4.0]), 20)
    batch = batch_of(4)
    with caplog.at_level(logging.WARNING, logger="livefit.server.train.accounting"):
        counted.account(batch, replace(policy.learn(batch), shift=shift), 0.01)
    assert sample(metrics, "livefit_train_target_shifts_total") == 1
    assert "20 recent targets lay beyond the outlier bound" in caplog.text
    assert "mean [40.0], std [2.0]" in caplog.text
