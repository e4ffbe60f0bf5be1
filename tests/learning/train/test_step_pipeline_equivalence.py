"""The pipelined trainer (``train.pipeline``) learns exactly what one batch after the other does,
over streams of thousands of samples.

The pipeline starts the next plain batch's step before the previous batch is finished,
assuming that step applies and brings no drift reaction; where it did not, it rewinds the early
step and the update policy and starts the batch again. Each test runs the same stream through a
real ``Trainer`` (its own thread, a queued backlog: plain batches) twice, pipeline off and on,
and compares the weights, the averaged weights, the optimizer's state, versions, scores and
statistics, array for array; the streams are built to make the pipeline rewind (non-finite
batches rolled back, drifts with a reaction, a new target level), and the tests check that it
did.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from livefit.server.train.hooks import TrainerHooks
from livefit.server.train.train_step import TrainStep
from livefit.server.train.trainer import Trainer
from tests.unit.train.test_step_pipeline_equivalence import (
    _assert_same,
    _classification_stream,
    _regression_stream,
    _trainer,
)


class _PredictionsWaiting(TrainerHooks):
    """Prediction requests always wait: every batch is plain (one step, no replay)."""

    def predictions_waiting(self) -> bool:
        return True


def _run(
    pipeline: str,
    settings: dict[str, Any],
    x: np.ndarray,
    y: np.ndarray,
    hooks: TrainerHooks | None = None,
) -> Trainer:
    """Every sample of ``x``, ``y`` trained, from a backlog, pipelined or not."""
    train = {"max_batch_size": 32, "pipeline": pipeline, **settings.get("train", {})}
    trainer = _trainer({**settings, "train": train}, x, y, hooks)
    trainer.start()
    trainer.stop(timeout=120)
    return trainer


def _state(trainer: Trainer) -> dict[str, Any]:
    policy = trainer.policy
    scaler = policy.scaling.scaler.state() if policy.scaling.scaler is not None else {}
    target = (
        policy.scaling.target_scaler.state() if policy.scaling.target_scaler is not None else {}
    )
    return {
        # every variable: weights, scaling and batch normalisation statistics, seed states
        "variables": [np.asarray(v) for v in trainer.model.variables],
        "optimizer": trainer.step.optimizer_state(),
        "average": list(trainer.step.average_state().values()),
        "scaler": list(scaler.values()),
        "target scaler": list(target.values()),
        "version": trainer.version,
        "samples": trainer.samples_seen,
        "scores": {k: (m.value, m.cumulative) for k, m in trainer.scores.scores.items()},
        "drifts": None if policy.drift is None else policy.drift.detections,
        "rate": policy.rate.current,
        "served average": trainer.step.serve_average,
        # the windowed losses that choose the served weights (sum, count per batch)
        "choice": [policy.choice.trained_loss.batches(), policy.choice.average_loss.batches()],
        "replay": [] if policy.replay is None else [
            np.array([len(policy.replay), policy.replay.seen]),
            *(a[: len(policy.replay)] for a in (policy.replay._x, policy.replay._y)),
        ],
    }  # fmt: skip


CASES = {
    "regression, defaults": ({"loss": "mse"}, _regression_stream),
    "regression, recover": ({"loss": "mse", "drift": {"reaction": "recover"}}, _regression_stream),
    # no reaction: the new level's batch is started early with a full replay buffer
    "regression, no reaction": ({"loss": "mse", "drift": {"reaction": "none"}}, _regression_stream),
    "classifier, defaults": ({"loss": "binary_crossentropy"}, _classification_stream),
    "classifier, boost_lr": (
        {"loss": "binary_crossentropy", "drift": {"reaction": "boost_lr"}},
        _classification_stream,
    ),
    # the forward pass moves dropout's seed state and batch normalisation's statistics
    "regression, dropout": (
        {"loss": "mse", "builder_options": {"dropout": 0.2}},
        _regression_stream,
    ),
    "regression, batch normalisation": (
        {"loss": "mse", "builder": "tests.custom_builder:build_batch_norm"},
        _regression_stream,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_pipeline_learns_what_one_batch_after_the_other_does(case: str) -> None:
    settings, stream = CASES[case]
    x, y = stream(np.random.default_rng(7))
    plain = _run("off", settings, x, y)
    piped = _run("on", settings, x, y)
    assert not plain.pipelined and piped.pipelined
    # the stream made it rewind (rolled-back steps, drift reactions)
    assert piped.pipeline.rewinds > 0
    _assert_same(_state(plain), _state(piped))
    # a rolled-back batch leaves nothing moved, batch normalisation's statistics included
    for trainer in (plain, piped):
        assert all(np.isfinite(np.asarray(v)).all() for v in trainer.model.variables)


def _count_choices(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Counters, ``counts[name][pipeline]`` for the run named in ``counts["run"]``: the steps
    that scored a sample of the rows with the averaged weights ("sampled") or none of them
    ("unscored"), and the switches of the served weights to the averaged ones ("to averaged")
    and back ("to trained")."""
    names = ("sampled", "unscored", "to averaged", "to trained")
    counts: dict[str, Any] = {name: {"off": 0, "on": 0} for name in names}
    counts["run"] = "off"
    from livefit.server.train.weight_choice import WeightChoice

    dispatch, choose = TrainStep.dispatch, WeightChoice.choose

    def counting_dispatch(self: TrainStep, *args: Any, **kwargs: Any) -> Any:
        dispatched = dispatch(self, *args, **kwargs)
        rows, pipeline = dispatched.average_rows, counts["run"]
        counts["sampled"][pipeline] += rows is not None and len(rows) > 0
        counts["unscored"][pipeline] += rows is not None and len(rows) == 0
        return dispatched

    def counting_choice(self: WeightChoice, first: Any, *args: Any) -> Any:
        before = self.step.serve_average
        served = choose(self, first, *args)
        pipeline = counts["run"]
        counts["to averaged"][pipeline] += self.step.serve_average and not before
        counts["to trained"][pipeline] += before and not self.step.serve_average
        return served

    monkeypatch.setattr(TrainStep, "dispatch", counting_dispatch)
    monkeypatch.setattr(WeightChoice, "choose", counting_choice)
    return counts


def test_a_pipelined_switch_of_the_served_weights_rescores_the_next_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Caught-up batches compare the trained and the averaged weights. While the trained
    weights are served, the averaged ones score a sample of each batch (``COMPARISON_ROWS``,
    here 8 of 32). When a finished batch makes the averaged weights the served ones, the batch
    started meanwhile scored them on a sample only: it is rewound and started again, so its
    scores cover every sample. When it makes the trained weights the served ones, the batch
    started meanwhile scored the averaged weights on every row, which one batch after the other
    would round apart on the sample: it is rewound too. Either way the pipeline learns exactly
    what one batch after the other does, the windowed losses that choose included.

    Every batch here counts as caught up (no backlog) and is plain (prediction requests wait),
    so that every batch compares and the pipeline overlaps them all."""
    from livefit.server.train import train_step
    from livefit.server.wire.samples import Batch

    monkeypatch.setattr(train_step, "COMPARISON_ROWS", 8)
    next_batch = Trainer.next_batch

    def caught_up(self: Trainer, *args: Any, **kwargs: Any) -> Batch | None:
        batch = next_batch(self, *args, **kwargs)
        return None if batch is None else replace(batch, backlog=0)

    monkeypatch.setattr(Trainer, "next_batch", caught_up)
    counts = _count_choices(monkeypatch)
    settings = {"loss": "binary_crossentropy", "train": {"yield_to_serving_ms": 0}}

    def run(pipeline: str) -> Trainer:
        counts["run"] = pipeline
        x, y = _classification_stream(np.random.default_rng(11))
        x, y = np.nan_to_num(x)[:2_400], y[:2_400]  # one concept: no drift, no rollback
        return _run(pipeline, settings, x, y, _PredictionsWaiting())

    plain, piped = run("off"), run("on")
    assert counts["sampled"]["off"] > 0 and counts["unscored"]["off"] == 0
    assert counts["to averaged"]["off"] > 0 and counts["to trained"]["off"] > 0
    assert piped.pipeline.rewinds > 0  # the switches' rewinds: nothing else rewinds on this stream
    _assert_same(_state(plain), _state(piped))
    for name in ("to averaged", "to trained"):
        assert counts[name]["on"] == counts[name]["off"], name


def test_a_backlog_compares_one_batch_in_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of the batches taken from a backlog one in ``BACKLOG_COMPARISON_EVERY`` compares the
    trained and the averaged weights (``WeightChoice.compares``); while the trained weights
    are served the averaged ones score no row of the others, and the windowed losses that
    choose hold the compared batches only. The last batch, which empties the queue, is caught
    up and compares too. Each comparison here switches the served weights (the verdict
    alternates): a switch to the averaged weights rewinds the batch the pipeline started
    meanwhile (it scored none of their rows), a switch back does not (it scored every row,
    which one batch after the other skips and nothing reads). One batch after the other
    learns exactly the same."""
    from livefit.server.train.update_policy import UpdatePolicy
    from livefit.server.train.weight_choice import BACKLOG_COMPARISON_EVERY, WeightChoice

    counts = _count_choices(monkeypatch)
    compared: dict[str, int] = {"off": 0, "on": 0}

    start = UpdatePolicy.start

    def counting_start(self: UpdatePolicy, batch: Any, *args: Any, **kwargs: Any) -> Any:
        started = start(self, batch, *args, **kwargs)
        compared[counts["run"]] += started.compare
        return started

    monkeypatch.setattr(UpdatePolicy, "start", counting_start)
    verdicts = {"n": 0}

    def alternating(self: WeightChoice) -> bool:
        verdicts["n"] += 1
        return verdicts["n"] % 2 == 1  # the averaged weights did better, then worse, ...

    monkeypatch.setattr(WeightChoice, "average_did_better", alternating)

    def run(pipeline: str) -> Trainer:
        counts["run"] = pipeline
        verdicts["n"] = 0
        x, y = _classification_stream(np.random.default_rng(11))
        x, y = np.nan_to_num(x)[:2_400], y[:2_400]
        # no snapshot due meanwhile: it would finish the batch before the next one is started,
        # and a switch there would have nothing to rewind
        settings = {"loss": "binary_crossentropy", "weights": {"serve_interval_s": 60}}
        return _run(pipeline, settings, x, y)

    plain, piped = run("off"), run("on")
    batches = 2_400 // 32  # the last one caught up
    every = BACKLOG_COMPARISON_EVERY
    # the plain run starts each batch once; the pipelined one starts a rewound batch again
    assert compared["off"] == (batches - 1) // every + 1
    # the compared batches' 32 rows each, all in the window (320 of its 500 samples)
    windows = [count for _, count in plain.policy.choice.trained_loss.batches()]
    assert windows == [32] * compared["off"]
    # a backlog's batch that does not compare scores no averaged row while the trained weights
    # are served (nor does a batch's later step, as ever)
    assert counts["unscored"]["off"] > 0
    for name in ("to averaged", "to trained"):
        assert counts[name]["on"] == counts[name]["off"] > 0, name
    # every switch to the averaged weights came from a backlog's batch (the last, caught-up
    # batch switches back) and rewound the batch started meanwhile; no switch back did
    assert piped.pipeline.rewinds == counts["to averaged"]["on"]
    _assert_same(_state(plain), _state(piped))


def test_a_batch_that_fails_is_counted_and_the_pipeline_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch whose learning raises (one batch's start, another one's finish, however often
    they are tried) is counted in ``livefit_internal_errors_total`` and logged; the trainer
    thread keeps training the rest."""
    x, y = _classification_stream(np.random.default_rng(2))
    x = np.nan_to_num(x)
    bad_start, bad_finish = x[20 * 32, 0], x[40 * 32, 0]  # the first rows of two batches
    from livefit.server.train.update_policy import UpdatePolicy

    start, finish = UpdatePolicy.start, UpdatePolicy.finish

    def failing_start(self: UpdatePolicy, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if batch.x[0, 0] == bad_start:
            raise RuntimeError("start failed")
        return start(self, batch, *args, **kwargs)

    def failing_finish(self: UpdatePolicy, started: Any, *args: Any, **kwargs: Any) -> Any:
        if started.batch.x[0, 0] == bad_finish:
            raise RuntimeError("finish failed")
        return finish(self, started, *args, **kwargs)

    monkeypatch.setattr(UpdatePolicy, "start", failing_start)
    monkeypatch.setattr(UpdatePolicy, "finish", failing_finish)
    # batches of 32 from the first sample (no fast start), so the bad rows start batches
    settings = {"loss": "binary_crossentropy", "train": {"fast_start_samples": 0}}
    trainer = _run("on", settings, x, y)
    errors = trainer.metrics.registry.get_sample_value(
        "livefit_internal_errors_total", {"component": "trainer"}
    )
    assert errors == 2
    assert trainer.samples_seen == len(x) - 2 * 32  # every other batch trained
    assert not trainer.running


def test_a_step_that_fails_inside_tensorflow_costs_only_its_own_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An asynchronous executor reports a step's error at a later call: the pipeline must
    still count it against that batch, lose no other batch, and end where one batch after the
    other ends (the failing batch's step here meets inputs of the wrong width, an error
    TensorFlow raises in its kernel, as a device error would)."""
    x, y = _classification_stream(np.random.default_rng(2))
    x, y = np.nan_to_num(x)[:1600], y[:1600]  # no rolled-back batch, no drift
    dispatch = TrainStep.dispatch
    bad = x[19 * 32, 0]  # the first row of the 20th batch: its every dispatch fails

    def run(pipeline: str) -> Trainer:
        def failing(self: TrainStep, x: np.ndarray, *rest: Any) -> Any:
            if x[0, 0] == bad:
                x = np.zeros((len(x), x.shape[1] + 3), np.float32)
            return dispatch(self, x, *rest)

        monkeypatch.setattr(TrainStep, "dispatch", failing)
        return _run(pipeline, {"loss": "binary_crossentropy"}, x, y)

    plain, piped = run("off"), run("on")
    for trainer in (plain, piped):
        errors = trainer.metrics.registry.get_sample_value(
            "livefit_internal_errors_total", {"component": "trainer"}
        )
        assert errors == 1 and trainer.samples_seen == len(x) - 32
    _assert_same(_state(plain), _state(piped))
