"""How a trainer learns from one minibatch: online scaling, replay, several steps, drift.

Per batch, after the compiled step scored it (test-then-train):
- ``steps_per_batch`` gradient steps, each on the new samples plus, with a replay buffer,
  ``replay_share`` of replayed ones (sampled afresh for each step; the batch joins the buffer
  only afterwards, so it never replays itself). With ``extras_when="caught_up"`` (the
  default) only a batch that took every queued sample (``Batch.backlog == 0``) gets the extra
  steps and the replay: the trainer is keeping up, and the extra work spends time it would
  otherwise wait. A batch taken from a backlog, or while prediction requests wait for the
  model, gets one step on its own samples, so a stream faster than the trainer is trained at
  the plain step's rate and predictions go first. The batch joins the buffer either way;
- the running standardizer takes in the batch and the model's ``Standardize`` layer gets the
  new statistics (scoring and training of this batch used the statistics from before it,
  as a streaming scaler must); with target scaling, likewise the targets' running
  standardizer and the model's ``target_scaling`` layer (only new samples count, once);
- with target scaling, a target beyond ``train.target_outlier_std`` standard deviations of
  the targets' running statistics is clipped to that bound first: for the statistics and the
  prequential scores, and its sample trains (and replays) with weight 0, so one sample moves
  the scaling by a bounded amount and the weights not at all (``Learned.outliers`` counts
  them); but a
  run of targets beyond it on one side (20 of the last 32) is a new level, not outliers: the
  target statistics are re-centred on those targets (the model's output moves to the new level
  at once) and the replay buffer, which holds the old level, is emptied (``Learned.shift``);
- the drift detector reads the batch's prequential losses; on drift it reports, and with a
  reaction configured resets the optimizer state, empties the replay buffer and/or raises the
  learning rate for a while (``drift.reaction``);
- a fresh model (not one restored from a checkpoint) starts at ``train.start_lr_factor`` times
  the learning rate, decaying linearly to it over ``train.start_steps`` steps.
- with weight averaging (``train.weight_average``) a reaction to drift (any but "none") also
  restarts the average from the current weights, and the average travels in the checkpoint's
  extra arrays beside the scalers' statistics, with the windowed losses that chose the served
  weights: a restarted learner serves what it served when the checkpoint was taken (the
  averaged weights where they had done better), not the trained ones until it re-learns that.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from livefit.models.standardize import broadcast_statistic, standardize_layer
from livefit.models.target_scaling import target_scaling_layer

from ..config.model import ModelSettings
from ..wire.samples import Batch
from .drift import DriftDetector
from .prequential import WindowedMean
from .replay import ReplayBuffer, mix
from .scaling import LevelShift, LevelShiftWatch, RunningStandardizer
from .train_step import Dispatched, StepResult, TrainStep, comparison_stride

log = logging.getLogger(__name__)
AVERAGE_WINDOW = 500  # samples: the windowed losses that choose trained or averaged weights
# Of the batches taken from a backlog, one in this many compares the trained and the averaged
# weights (``UpdatePolicy.compares``); every caught-up batch does.
BACKLOG_COMPARISON_EVERY = 8


@dataclass(frozen=True, slots=True)
class Learned:
    """What learning one batch did: the first step's result (its scores are prequential)."""

    first: StepResult
    steps: int  # steps applied (each one version)
    replayed: int  # replayed samples, over all steps
    drift: bool
    y: np.ndarray  # the batch's targets as trained and scored (outliers clipped)
    outliers: int = 0  # samples whose target was clipped
    shift: LevelShift | None = None  # a new target level this batch re-centred the scaling on


@dataclass(slots=True)
class Started:
    """A batch ``UpdatePolicy.start`` has begun to learn; ``finish`` completes it. A plain
    batch (one step on its own samples) may still be running (``dispatched``); a batch with
    extra steps or replay has run them (``first``)."""

    batch: Batch  # as learned (outlying targets clipped)
    outliers: int
    shift: LevelShift | None
    dispatched: Dispatched | None = None  # the plain batch's step, not collected yet
    first: StepResult | None = None  # the first step's result, once known
    steps: int = 0
    replayed: int = 0
    clear_replay: bool = False  # a level shift empties the replay buffer at finish
    assumed: bool = False  # ``assume_applied`` already moved the rate on for this step
    # With weight averaging: whether this batch's scores feed the comparison that chooses the
    # served weights (a caught-up batch: ``UpdatePolicy.compares``)
    compare: bool = True


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What ``start`` changes in an ``UpdatePolicy`` (scalers, level watch, rate boost), as
    ``state_point`` saved it: ``restore_point`` puts it back."""

    scaler: RunningStandardizer | None
    target_scaler: RunningStandardizer | None
    saved_scaler: RunningStandardizer | None
    saved_target_scaler: RunningStandardizer | None
    shift_watch: LevelShiftWatch
    boost: LrBoost
    rate: float | None
    uncompared: int


class UpdatePolicy:
    """Scaling, replay, steps per batch and drift handling for one model's trainer thread.

    ``learn`` is ``finish(start(batch))``. The trainer's pipeline (``train.pipeline``) calls the
    two apart: it starts the next plain batch while the step before it still runs, assuming
    that step applies and brings no drift reaction (``assume_applied``); where it did not, it
    rewinds the next step and this policy (``state_point``, ``restore_point``) and starts that
    batch again, so the result is the same as learning one batch after the other.
    """

    def __init__(
        self,
        settings: ModelSettings,
        step: TrainStep,
        on_drift: Callable[[int], None] | None = None,
        seed: int | None = None,
    ) -> None:
        train = settings.train
        self.step = step
        self.steps_per_batch = settings.resolved_steps_per_batch()
        self.replay_share = train.replay_share
        self.extras_always = train.extras_when == "always"
        replay_capacity = settings.resolved_replay_capacity()
        self.replay = (
            ReplayBuffer(replay_capacity, train.replay_mode, seed)
            if replay_capacity > 0 and train.replay_share > 0
            else None
        )
        self.layer = standardize_layer(step.model)
        self.scaler = (
            RunningStandardizer(per_last_axis=settings.builder == "lstm")
            if self.layer is not None
            else None
        )
        self.target_layer = target_scaling_layer(step.model)
        self.target_scaler = RunningStandardizer() if self.target_layer is not None else None
        self.target_outlier_std = train.target_outlier_std
        self.shift_watch = LevelShiftWatch()
        drift = settings.drift
        self.drift = (
            DriftDetector(drift.method, threshold=drift.threshold)
            if drift.enabled and drift.method == "page_hinkley"
            else DriftDetector(drift.method)
            if drift.enabled
            else None
        )
        self.reaction = drift.reaction
        self.boost_factor = drift.boost_factor
        self.boost_steps = drift.boost_steps
        self.on_drift = on_drift
        self._base_lr = self.learning_rate  # the configured rate, before any boost
        self._boost = LrBoost()
        if train.start_lr_factor > 1:
            self._boost = LrBoost(train.start_lr_factor, train.start_steps, decays=True)
            self._set_lr(self._base_lr * self._boost.factor())
        # With weight averaging: the recent prequential losses of both weights (see
        # _choose_weights); the step serves whichever did better.
        self._trained_loss = WindowedMean(AVERAGE_WINDOW)
        self._average_loss = WindowedMean(AVERAGE_WINDOW)
        # Whether the last plain batch started scored the averaged weights on rows that depend
        # on which weights were served when it started, so that a switch of the served weights
        # before it finishes needs it started again (see ``start``).
        self._started_served_dependent = False
        self._uncompared = 0  # batches started since the last one compared (``compares``)
        self._saved_scaler: RunningStandardizer | None = None
        self._saved_target_scaler: RunningStandardizer | None = None

    def learn(self, batch: Batch, extras_allowed: bool = True) -> Learned:
        """Score and learn ``batch``; rolled-back steps are not counted in ``steps``.

        With ``extras_when="caught_up"`` the extra steps and the replay need ``extras_allowed``
        (the trainer passes False while prediction requests wait) and a batch without backlog.
        """
        return self.finish(self.start(batch, extras_allowed))

    def compares(self, batch: Batch) -> bool:
        """Whether ``batch``'s scores feed the comparison between the trained and the averaged
        weights (with ``train.weight_average``): every caught-up batch's (``Batch.backlog``
        0), and one in ``BACKLOG_COMPARISON_EVERY`` of the batches taken from a backlog. Like
        the extra steps and the replay, most of the comparison is work a trainer behind its
        stream skips: the other batches of a backlog are scored with the averaged weights only
        where they are the served ones (their scores are then the prequential ones), and
        cost no second forward pass where they are not. The choice goes on following the
        stream, from fewer batches. Measured at batch 1,024: the averaged weights' pass on 256
        sampled rows was 12-20 % of the step, and a switch of the served weights restarts the
        batch the pipelined trainer started meanwhile (BENCHMARKS.md, trainer)."""
        return batch.backlog == 0 or self._uncompared + 1 >= BACKLOG_COMPARISON_EVERY

    def plain(self, batch: Batch, extras_allowed: bool = True) -> bool:
        """Whether ``batch`` gets one step on its own samples (no extra steps, no replay)."""
        return not (self.extras_always or (extras_allowed and batch.backlog == 0))

    def start(self, batch: Batch, extras_allowed: bool = True) -> Started:
        """Begin learning ``batch``: scaling, clipping and the step(s). A plain batch's step is
        dispatched and may still run when this returns (``TrainStep.dispatch``); a batch with
        extras runs them all here (each depends on the one before)."""
        plain = self.plain(batch, extras_allowed)
        # A plain batch reads no replay before its finish, so a level shift's emptying of the
        # buffer waits for it: the previous batch, finished meanwhile, joins it first.
        shift = self._follow_level_shift(batch, clear_replay=not plain)
        batch, outliers = self._clip_target_outliers(batch)
        statistics = self._next_statistics(batch)
        target_statistics = self._next_target_statistics(batch)
        compare = self.compares(batch)
        self._uncompared = 0 if compare else self._uncompared + 1
        started = Started(
            batch, outliers, shift, clear_replay=plain and shift is not None, compare=compare
        )
        # The rows whose scores by the averaged weights are read: the batch's own samples where
        # they are served or compared, else none
        averaged_rows = len(batch) if compare or self.step.serve_average else 0
        if plain:
            started.dispatched = self.step.dispatch(
                batch.x, batch.y, batch.w, statistics, target_statistics, averaged_rows
            )
            # A switch of the served weights before this batch finishes changes what it should
            # have scored: the averaged weights on every row where they become served (none or
            # a sample scored), and, compared, the sample of a large batch (every row scored
            # while they were served: one batch after the other rounds that sample apart).
            self._started_served_dependent = (
                comparison_stride(len(batch)) > 1 if compare else not self.step.serve_average
            )
            return started
        for _ in range(self.steps_per_batch):
            x, y, w, k = self._with_replay(batch)
            # Only the first step's scores of the batch's own samples are read (prequential);
            # the experts learn and are weighed on those samples once
            first = started.first is None
            scored = averaged_rows if first else 0
            fresh = len(batch) if first else 0
            result = self.step(x, y, w, statistics, target_statistics, scored, fresh)
            statistics = target_statistics = None  # set by the first applied step
            if started.first is None:
                started.first = _first_rows(result, len(batch))
            if not result.applied:
                break
            started.steps += 1
            started.replayed += k
            self._after_step()
        return started

    def assume_applied(self, started: Started) -> None:
        """Move the learning rate on as ``finish`` will if ``started``'s step applies, so a
        batch started before that finish runs at the rate it would have."""
        if started.dispatched is not None and not started.assumed:
            started.assumed = True
            self._after_step()

    def finish(self, started: Started, surprise: Callable[[], None] | None = None) -> Learned:
        """Complete ``started`` (waits for its step). ``surprise`` is called first where the
        step did not apply or drift brings a reaction: what ``assume_applied`` took for
        granted (the trainer then rewinds what it started on that assumption, and this
        policy to ``state_point``)."""
        batch = started.batch

        def undo_assumption() -> None:
            """Back to before ``assume_applied``: the caller's rewind, then the rate as this
            step's outcome moves it."""
            if not started.assumed:
                return
            started.assumed = False
            if surprise is not None:
                surprise()
            if started.steps:
                self._after_step()

        if started.dispatched is not None:
            result = self.step.collect(started.dispatched)
            started.dispatched = None
            started.first = result
            if result.applied:
                started.steps = 1
                if not started.assumed:
                    self._after_step()
            else:
                undo_assumption()
        first = started.first
        assert first is not None
        if started.clear_replay and self.replay is not None:
            self.replay.clear()
        served_average = self.step.serve_average
        first = self._choose_weights(first, started.compare)
        if self.step.serve_average != served_average and self._started_served_dependent:
            # A step started since (on the assumption) scored the averaged weights as the
            # weights served before this batch had them (``start``): it is rewound and started
            # again.
            undo_assumption()
        # before the batch joins replay: a flush keeps the batch
        drift = self._watch(first, undo_assumption)
        if started.steps:
            self._absorb(batch)
        else:  # rolled back: so are the statistics
            if self._saved_scaler is not None:
                self.scaler = self._saved_scaler
            if self._saved_target_scaler is not None:
                self.target_scaler = self._saved_target_scaler
        return Learned(
            first, started.steps, started.replayed, drift, batch.y, started.outliers, started.shift
        )

    def state_point(self) -> PolicyState:
        """What ``start`` changes, saved (cheap: the scalers' arrays are never written into)."""
        return PolicyState(
            None if self.scaler is None else self.scaler.copy(),
            None if self.target_scaler is None else self.target_scaler.copy(),
            self._saved_scaler,
            self._saved_target_scaler,
            copy.copy(self.shift_watch),
            copy.copy(self._boost),
            self.step.learning_rate,
            self._uncompared,
        )

    def restore_point(self, point: PolicyState) -> None:
        """Put back what ``state_point`` saved."""
        self.scaler, self.target_scaler = point.scaler, point.target_scaler
        self._saved_scaler = point.saved_scaler
        self._saved_target_scaler = point.saved_target_scaler
        self.shift_watch, self._boost = point.shift_watch, point.boost
        if point.rate is not None:
            self.step.learning_rate = point.rate
        self._uncompared = point.uncompared

    def _choose_weights(self, first: StepResult, compare: bool = True) -> StepResult:
        """With weight averaging: the scores of the weights served before this batch (the
        averaged ones where their windowed prequential loss was the lower), then, where the
        batch is ``compare``d, with this batch's losses of both added (of the rows both scored:
        the averaged weights, when not served, score a sample of a large batch), which weights
        to serve from now on."""
        if first.average_losses is None or first.average_predictions is None:
            return first
        served = first
        rows = first.average_rows
        if self.step.serve_average:
            if rows is not None:  # TrainStep scores every row of the served weights
                raise RuntimeError("the served averaged weights scored a sample of the batch")
            served = replace(
                first,
                prequential_losses=first.average_losses,
                predictions=first.average_predictions,
            )
        if first.applied and compare:
            # The same rows whichever weights were served (``comparison_stride``): those the
            # averaged weights score when they are not.
            compared = slice(None, None, comparison_stride(len(first.prequential_losses)))
            averaged = first.average_losses if rows is not None else first.average_losses[compared]
            self._trained_loss.add(first.prequential_losses[compared])
            self._average_loss.add(averaged)
            self.step.serve_average = self._average_did_better()
        return served

    def _average_did_better(self) -> bool:
        """Whether the averaged weights' windowed prequential loss is the lower (False while
        neither has one)."""
        return bool(self._average_loss.value < self._trained_loss.value)

    def _with_replay(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        if self.replay is None:
            return batch.x, batch.y, batch.w, 0
        return mix(batch.x, batch.y, batch.w, self.replay, self.replay_share)

    def _follow_level_shift(self, batch: Batch, clear_replay: bool = True) -> LevelShift | None:
        """Re-centre the target statistics when the batch completes a run of targets beyond
        the outlier bound on one side (a new level), and empty the replay buffer (with
        ``clear_replay``; else the caller does, later)."""
        if self.target_scaler is None or self.target_layer is None:
            return None
        bounds = self.target_scaler.bounds(self.target_outlier_std)
        if bounds is None:
            return None
        y = np.reshape(batch.y, (len(batch.y), *self.target_layer.stats_shape))
        shift = self.shift_watch.observe(y, bounds)
        if shift is None:
            return None
        self.target_scaler = self.target_scaler.recentred(shift)
        if self.replay is not None and clear_replay:
            self.replay.clear()
        return shift

    def _clip_target_outliers(self, batch: Batch) -> tuple[Batch, int]:
        """``batch`` with its outlying targets clipped to the targets' running bounds and
        their samples' weights 0, and how many samples that changed (the batch itself when
        none).

        The bound is what an outlier's target is scored against and enters the statistics
        as; the model learns nothing from it: at the bound its error is still many times a
        good sample's, and its step and replays held a model away from the stream for
        thousands of samples.
        """
        if self.target_scaler is None or self.target_layer is None:
            return batch, 0
        shape = self.target_layer.stats_shape
        y = np.reshape(batch.y, (len(batch.y), *shape))
        clipped, rows = self.target_scaler.clip_outliers(y, self.target_outlier_std)
        outliers = int(np.count_nonzero(rows))
        if not outliers:
            return batch, 0
        w = np.where(rows, 0, batch.w).astype(batch.w.dtype, copy=False)
        return replace(batch, y=np.reshape(clipped, batch.y.shape), w=w), outliers

    def _next_statistics(self, batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
        """The scaling statistics including ``batch``, for the step to set after its update."""
        if self.scaler is None or self.layer is None:
            return None
        self._saved_scaler = self.scaler.copy()
        self.scaler.update(batch.x)
        mean, std = self.scaler.mean_std()
        shape = self.layer.stats_shape
        return broadcast_statistic(mean, shape), broadcast_statistic(std, shape)

    def _next_target_statistics(self, batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
        """The targets' statistics including ``batch`` (its new samples only, never replayed
        ones), for the step to set after its update."""
        if self.target_scaler is None or self.target_layer is None:
            return None
        self._saved_target_scaler = self.target_scaler.copy()
        shape = self.target_layer.stats_shape
        self.target_scaler.update(np.reshape(batch.y, (len(batch.y), *shape)))
        mean, std = self.target_scaler.mean_std()
        return broadcast_statistic(mean, shape), broadcast_statistic(std, shape)

    def _absorb(self, batch: Batch) -> None:
        """The batch joins the replay buffer."""
        if self.replay is not None:
            self.replay.add(batch.x, batch.y, batch.w)

    def _watch(self, first: StepResult, surprise: Callable[[], None] | None = None) -> bool:
        if self.drift is None or not first.applied:
            return False
        if not self.drift.update(first.prequential_losses):
            return False
        if surprise is not None and self.reaction != "none":
            surprise()  # the reaction changes what a step started since assumed
        log.warning(
            "drift detected (detection %d); reaction: %s", self.drift.detections, self.reaction
        )
        if self.reaction == "reset_optimizer":
            reset_optimizer_state(self.step.model, self.step.optimized)
        elif self.reaction == "boost_lr":
            self._boost = LrBoost(self.boost_factor, self.boost_steps, decays=False)
            self._set_lr(self._base_lr * self._boost.factor())
        elif self.reaction in ("flush_replay", "recover") and self.replay is not None:
            self.replay.clear()
        if self.reaction != "none":
            self.step.reset_average()  # the old concept's weights leave what is served
        if self.reaction == "recover":
            self._boost = LrBoost(self.boost_factor, self.boost_steps, decays=True)
            self._set_lr(self._base_lr * self._boost.factor())
        if self.on_drift is not None:
            self.on_drift(self.drift.detections)
        return True

    def _after_step(self) -> None:
        if self._boost.left > 0:
            self._boost.left -= 1
            self._set_lr(self._base_lr * self._boost.factor())

    @property
    def lr_factor(self) -> float:
        """The learning rate's current multiple of the configured one (1 outside boosts)."""
        return self._boost.factor()

    @property
    def learning_rate(self) -> float:
        """The learning rate the next step runs at (the step assigns it to the optimizer in
        its graph, so the optimizer's variable holds the last step's)."""
        if self.step.learning_rate is not None:
            return self.step.learning_rate
        return float(np.asarray(self.step.model.optimizer.learning_rate))

    def _set_lr(self, value: float) -> None:
        if self.step.learning_rate is not None:
            self.step.learning_rate = value  # assigned in the step's graph
        else:  # a learning-rate schedule: not an input of the step
            self.step.model.optimizer.learning_rate = value

    # checkpoint state --------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Arrays to save with a checkpoint: the scalers' running statistics; with weight
        averaging the average and the windowed losses that choose the served weights."""
        state: dict[str, np.ndarray] = {}
        for prefix, scaler in (("scaler_", self.scaler), ("target_scaler_", self.target_scaler)):
            if scaler is not None:
                state.update({f"{prefix}{k}": v for k, v in scaler.state().items()})
        state.update(self.step.average_state())
        if self.step.averaging:
            state["average_choice_trained"] = self._trained_loss.batches()
            state["average_choice_averaged"] = self._average_loss.batches()
        return state

    def restore(self, extra: dict[str, np.ndarray]) -> None:
        """Take the scalers' statistics and the average from a checkpoint; a restored model is
        not fresh, so a start boost still running ends here."""
        if self._boost.left > 0:
            self._boost = LrBoost()
            self._set_lr(self._base_lr)
        self.step.restore_average(extra)
        self._restore_choice(extra)
        if self.scaler is not None and "scaler_count" in extra:
            self.scaler = _restored_scaler(extra, "scaler_")
        if self.target_scaler is not None and "target_scaler_count" in extra:
            self.target_scaler = _restored_scaler(extra, "target_scaler_")

    def _restore_choice(self, extra: dict[str, np.ndarray]) -> None:
        """Serve what was served at the checkpoint: its windowed losses of both weights, and
        the choice they make. A checkpoint without them (or without an average) leaves the
        trained weights served until the average does better."""
        keys = ("average_choice_trained", "average_choice_averaged", "average_steps")
        if not self.step.averaging or any(key not in extra for key in keys):
            return
        try:
            trained = WindowedMean.from_batches(AVERAGE_WINDOW, extra[keys[0]])
            averaged = WindowedMean.from_batches(AVERAGE_WINDOW, extra[keys[1]])
        except ValueError as error:  # a checkpoint that passed its checksum but not this
            log.warning(
                "checkpoint's choice between averaged and trained weights is unreadable (%s): "
                "serving the trained weights until the average does better",
                error,
            )
            return
        self._trained_loss, self._average_loss = trained, averaged
        self.step.serve_average = self._average_did_better()


def reset_optimizer_state(model: Any, variables: list | None = None) -> None:
    """Put ``model``'s optimizer state back to a fresh optimizer's (step count 0, moments 0,
    Nadam's momentum product 1), keeping its learning rate. ``variables``: those the optimizer
    trains (default: every trainable variable; with experts, the network's).

    The values come from a new optimizer of the same configuration built on the same
    variables: zeroing every optimizer variable would also zero the learning rate (a Keras 3
    optimizer variable) and stop learning for good.
    """
    optimizer = model.optimizer
    fresh = type(optimizer).from_config(optimizer.get_config())
    fresh.build(model.trainable_variables if variables is None else variables)
    rate = optimizer.learning_rate
    for live, new in zip(optimizer.variables, fresh.variables, strict=True):
        if live is rate or live.path.endswith("/learning_rate"):
            continue
        live.assign(np.asarray(new))


@dataclass(slots=True)
class LrBoost:
    """A learning-rate multiplier lasting ``steps`` training steps: constant, or decaying
    linearly from ``peak`` towards 1 (1 again once ``left`` reaches 0)."""

    peak: float = 1.0
    steps: int = 0
    decays: bool = False
    left: int = -1  # steps still boosted; -1: all of them (set in __post_init__)

    def __post_init__(self) -> None:
        if self.left < 0:
            self.left = self.steps

    def factor(self) -> float:
        if self.left <= 0:
            return 1.0
        if not self.decays:
            return self.peak
        return 1.0 + (self.peak - 1.0) * self.left / self.steps


def _restored_scaler(extra: dict[str, np.ndarray], prefix: str) -> RunningStandardizer:
    """The running standardizer saved under ``prefix`` in a checkpoint's extra arrays."""
    state = {k.removeprefix(prefix): v for k, v in extra.items() if k.startswith(prefix)}
    state["count"] = np.asarray(state["count"]).reshape(())
    state["per_last_axis"] = np.asarray(state["per_last_axis"]).reshape(())
    return RunningStandardizer.from_state(state)


def _first_rows(result: StepResult, n: int) -> StepResult:
    """The scores of the new samples only: replayed ones are not test-then-train (the step
    scored the averaged weights on these rows only: ``scored_rows``)."""
    if len(result.prequential_losses) == n:
        return result
    rows = result.average_rows
    average_losses, average_predictions = result.average_losses, result.average_predictions
    if rows is None:  # the averaged weights scored every row, the replayed ones too
        if average_losses is not None and average_predictions is not None:
            average_losses, average_predictions = average_losses[:n], average_predictions[:n]
    elif len(rows) == n:  # indices below n: exactly 0..n-1
        rows = None
    return replace(
        result,
        prequential_losses=result.prequential_losses[:n],
        predictions=result.predictions[:n],
        average_losses=average_losses,
        average_predictions=average_predictions,
        average_rows=rows,
    )
