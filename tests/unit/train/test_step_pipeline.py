"""``StepPipeline`` on a real rewindable step: batches overlapped learn what one batch after the
other does (a rolled-back batch rewinds the one started after it), a batch that fails to start
is counted and the next goes on; ``pipelining`` says where the pipeline runs."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.train import step_pipeline
from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.placement import as_placement
from livefit.server.train.step_pipeline import (
    Pending,
    StepPipeline,
    asynchronous_executor,
    pipelining,
)
from livefit.server.train.update_policy import Learned, UpdatePolicy
from livefit.server.wire.samples import Batch
from tests.unit.train.test_accounting import SETTINGS, batch_of, policy_of


def plain(batch: Batch) -> Batch:
    """``batch`` as taken from a backlog: one step on its own samples, no replay."""
    return Batch(batch.x, batch.y, batch.w, 1, None, None, None, backlog=1)


def stream() -> list[Batch]:
    batches = [plain(batch_of(8, seed=seed)) for seed in range(6)]
    batches[2].x[3] = np.nan  # its step is rolled back: the one started after it is rewound
    return batches


def piped(policy: UpdatePolicy, batches: list[Batch]) -> tuple[StepPipeline, list[int]]:
    """``batches`` through a pipeline of ``policy``: what it accounted, in order (batch ids)."""
    accounted: list[int] = []

    def account(batch: Batch, learned: Learned, elapsed: float) -> None:
        accounted.append(next(i for i, b in enumerate(batches) if b is batch))

    pipeline = StepPipeline("m", policy, account, TrainerHooks(), Metrics())
    pending: Pending | None = None
    with asynchronous_executor():
        for batch in batches:
            pending = pipeline.overlap(pending, batch)
        pipeline.complete(pending)
    return pipeline, accounted


def test_overlapped_batches_learn_what_one_batch_after_the_other_does() -> None:
    alone, overlapped = policy_of(rewindable=True), policy_of(rewindable=True)
    batches = stream()
    learned = [alone.learn(batch) for batch in batches]
    pipeline, accounted = piped(overlapped, batches)
    assert accounted == list(range(len(batches)))  # each once, in order
    assert [r.first.applied for r in learned].count(False) == 1
    assert pipeline.rewinds >= 1
    assert (
        pipeline.metrics.registry.get_sample_value("livefit_train_rewinds_total", {"model": "m"})
        == pipeline.rewinds
    )
    for a, b in zip(alone.step.model.variables, overlapped.step.model.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.name)
    for a, b in zip(alone.step.optimizer_state(), overlapped.step.optimizer_state(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_batch_that_fails_to_start_is_counted_and_the_next_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    policy = policy_of(rewindable=True)
    batches = [plain(batch_of(8, seed=seed)) for seed in range(3)]
    start = policy.start

    def failing(batch: Batch, extras_allowed: bool = True) -> Any:
        if batch is batches[1]:
            raise RuntimeError("a bug")
        return start(batch, extras_allowed)

    monkeypatch.setattr(policy, "start", failing)
    with caplog.at_level(logging.ERROR, logger="livefit.server.train.step_pipeline"):
        pipeline, accounted = piped(policy, batches)
    assert accounted == [0, 2]
    errors = pipeline.metrics.registry.get_sample_value(
        "livefit_internal_errors_total", {"component": "trainer"}
    )
    assert errors == 1
    assert "training step failed for m (batch of 8)" in caplog.text


def settings(pipeline: str, **more: Any) -> ModelSettings:
    return ModelSettings.model_validate({**SETTINGS, "train": {"pipeline": pipeline}, **more})


@pytest.mark.parametrize(
    ("mode", "cores", "serving_here", "expected"),
    [
        ("off", 8, False, False),
        ("on", 1, True, True),
        ("auto", 2, False, True),
        ("auto", 1, False, False),  # the bookkeeping and the step would only take turns
        ("auto", 8, True, False),  # a one-process learner's event loop needs the GIL
    ],
)
def test_where_the_pipeline_runs(
    monkeypatch: pytest.MonkeyPatch, mode: str, cores: int, serving_here: bool, expected: bool
) -> None:
    monkeypatch.setattr(step_pipeline, "usable_cores", lambda: cores)
    assert pipelining(settings(mode), as_placement("/CPU:0"), serving_here) is expected


def test_never_with_model_selection_or_several_devices() -> None:
    selection = {"enabled": True, "candidates": [{"name": "fast", "learning_rate": 0.05}]}
    assert not pipelining(settings("on", selection=selection), as_placement("/CPU:0"), False)
    mirrored = SimpleNamespace(replicas=2)
    assert not pipelining(settings("on"), mirrored, False)  # type: ignore[arg-type]
