"""How a trainer learns from one minibatch: its steps, replay and drift, composed with the
batch's scaling (``batch_scaling``), the learning rate (``learning_rate``) and, with weight
averaging, the choice of the served weights (``weight_choice``).

Per batch, after the compiled step scored it (test-then-train):
- ``steps_per_batch`` gradient steps, each on the new samples plus, with a replay buffer,
  ``replay_share`` of replayed ones (sampled afresh for each step; the batch joins the buffer
  only afterwards, so it never replays itself). With ``extras_when="caught_up"`` (the
  default) only a batch that took every queued sample (``Batch.backlog == 0``) gets the extra
  steps and the replay: the trainer is keeping up, and the extra work spends time it would
  otherwise wait. A batch taken from a backlog, or while prediction requests wait for the
  model, gets one step on its own samples, so a stream faster than the trainer is trained at
  the plain step's rate and predictions go first. The batch joins the buffer either way;
- the inputs' and targets' running statistics take in the batch, outlying targets are
  clipped and trained with weight 0, and a new level of the targets re-centres them and
  empties the replay buffer, which holds the old level (``BatchScaling``;
  ``Learned.outliers``, ``Learned.shift``);
- the drift detector reads the batch's prequential losses; on drift it reports, and with a
  reaction configured resets the optimizer state, empties the replay buffer and/or raises the
  learning rate for a while (``drift.reaction``); any reaction but "none" also restarts the
  weight average from the current weights;
- checkpoints carry the statistics, the average and the windowed losses that chose the served
  weights: a restarted learner serves what it served when the checkpoint was taken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..config.model import ModelSettings
from ..wire.samples import Batch
from .batch_scaling import BatchScaling, ScalingPoint
from .drift import DriftDetector
from .learning_rate import LearningRate, RatePoint
from .replay import ReplayBuffer, mix
from .scaling import LevelShift
from .train_step import Dispatched, StepResult, TrainStep
from .weight_choice import WeightChoice

log = logging.getLogger(__name__)


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
    # served weights (a caught-up batch: ``WeightChoice.compares``)
    compare: bool = True


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What ``start`` changes in an ``UpdatePolicy`` (scalers, level watch, rate boost, the
    comparison's count), as ``state_point`` saved it: ``restore_point`` puts it back."""

    scaling: ScalingPoint
    rate: RatePoint
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
        self.scaling = BatchScaling(
            step.model, settings.builder == "lstm", train.target_outlier_std
        )
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
        self.rate = LearningRate(step, train.start_lr_factor, train.start_steps)
        # With weight averaging: which weights are served, from both ones' recent losses
        self.choice = WeightChoice(step)

    def learn(self, batch: Batch, extras_allowed: bool = True) -> Learned:
        """Score and learn ``batch``; rolled-back steps are not counted in ``steps``.

        With ``extras_when="caught_up"`` the extra steps and the replay need ``extras_allowed``
        (the trainer passes False while prediction requests wait) and a batch without backlog.
        """
        return self.finish(self.start(batch, extras_allowed))

    def plain(self, batch: Batch, extras_allowed: bool = True) -> bool:
        """Whether ``batch`` gets one step on its own samples (no extra steps, no replay)."""
        return not (self.extras_always or (extras_allowed and batch.backlog == 0))

    def start(self, batch: Batch, extras_allowed: bool = True) -> Started:
        """Begin learning ``batch``: scaling, clipping and the step(s). A plain batch's step is
        dispatched and may still run when this returns (``TrainStep.dispatch``); a batch with
        extras runs them all here (each depends on the one before)."""
        plain = self.plain(batch, extras_allowed)
        shift = self.scaling.follow_level_shift(batch)
        # A plain batch reads no replay before its finish, so a level shift's emptying of the
        # buffer (which holds the old level) waits for it: the previous batch, finished
        # meanwhile, joins it first.
        if shift is not None and not plain and self.replay is not None:
            self.replay.clear()
        batch, outliers = self.scaling.clip_target_outliers(batch)
        statistics = self.scaling.next_statistics(batch)
        target_statistics = self.scaling.next_target_statistics(batch)
        compare, averaged_rows = self.choice.start(batch)
        started = Started(
            batch, outliers, shift, clear_replay=plain and shift is not None, compare=compare
        )
        if plain:
            started.dispatched = self.step.dispatch(
                batch.x, batch.y, batch.w, statistics, target_statistics, averaged_rows
            )
            self.choice.started(batch, compare)
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
            self.rate.after_step()
        return started

    def assume_applied(self, started: Started) -> None:
        """Move the learning rate on as ``finish`` will if ``started``'s step applies, so a
        batch started before that finish runs at the rate it would have."""
        if started.dispatched is not None and not started.assumed:
            started.assumed = True
            self.rate.after_step()

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
                self.rate.after_step()

        if started.dispatched is not None:
            result = self.step.collect(started.dispatched)
            started.dispatched = None
            started.first = result
            if result.applied:
                started.steps = 1
                if not started.assumed:
                    self.rate.after_step()
            else:
                undo_assumption()
        first = started.first
        assert first is not None
        if started.clear_replay and self.replay is not None:
            self.replay.clear()
        served_average = self.step.serve_average
        first = self.choice.choose(first, started.compare)
        if self.step.serve_average != served_average and self.choice.started_served_dependent:
            # A step started since (on the assumption) scored the averaged weights as the
            # weights served before this batch had them (``WeightChoice.started``): it is
            # rewound and started again.
            undo_assumption()
        # before the batch joins replay: a flush keeps the batch
        drift = self._watch(first, undo_assumption)
        if started.steps:
            self._absorb(batch)
        else:  # rolled back: so are the statistics
            self.scaling.roll_back()
        return Learned(
            first, started.steps, started.replayed, drift, batch.y, started.outliers, started.shift
        )

    def state_point(self) -> PolicyState:
        """What ``start`` changes, saved (cheap: the scalers' arrays are never written into)."""
        return PolicyState(self.scaling.point(), self.rate.point(), self.choice.uncompared)

    def restore_point(self, point: PolicyState) -> None:
        """Put back what ``state_point`` saved."""
        self.scaling.restore_point(point.scaling)
        self.rate.restore_point(point.rate)
        self.choice.uncompared = point.uncompared

    def _with_replay(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        if self.replay is None:
            return batch.x, batch.y, batch.w, 0
        return mix(batch.x, batch.y, batch.w, self.replay, self.replay_share)

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
            self.rate.start_boost(self.boost_factor, self.boost_steps, decays=False)
        elif self.reaction in ("flush_replay", "recover") and self.replay is not None:
            self.replay.clear()
        if self.reaction != "none":
            self.step.reset_average()  # the old concept's weights leave what is served
        if self.reaction == "recover":
            self.rate.start_boost(self.boost_factor, self.boost_steps, decays=True)
        if self.on_drift is not None:
            self.on_drift(self.drift.detections)
        return True

    def start_over_from(self, weights: list[np.ndarray]) -> None:
        """Train on from ``weights`` (an operator's rollback to a kept version): a fresh
        optimizer state, an empty replay buffer and a restarted average, so nothing learned
        on the way from them (perhaps the reason for the rollback) is replayed into them."""
        self.step.model.set_weights(weights)
        reset_optimizer_state(self.step.model, self.step.optimized)
        if self.replay is not None:
            self.replay.clear()
        self.step.reset_average()

    # checkpoint state --------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Arrays to save with a checkpoint: the scalers' running statistics; with weight
        averaging the average and the windowed losses that choose the served weights."""
        return {**self.scaling.state(), **self.step.average_state(), **self.choice.state()}

    def restore(self, extra: dict[str, np.ndarray]) -> None:
        """Take the scalers' statistics and the average from a checkpoint; a restored model is
        not fresh, so a start boost still running ends here."""
        self.rate.end_boost()
        self.step.restore_average(extra)
        self.choice.restore(extra)
        self.scaling.restore(extra)


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
