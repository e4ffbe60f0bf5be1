"""The learning rate each training step runs at: the configured one, times a boost.

A fresh model (not one restored from a checkpoint) starts at ``train.start_lr_factor`` times
the rate, decaying linearly over ``train.start_steps`` steps; a drift reaction may raise it for
a while (``drift.reaction`` ``boost_lr``, constant, or ``recover``, decaying). The rate is an
input of the compiled step (``TrainStep.learning_rate``), assigned in its graph, so setting it
here costs nothing until the next step; a learning-rate schedule, which is no input of the
step, is set on the optimizer instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .train_step import TrainStep


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


@dataclass(frozen=True, slots=True)
class RatePoint:
    """The boost and the next step's rate, as ``LearningRate.point`` saved them."""

    boost: LrBoost
    rate: float | None


class LearningRate:
    """One step's learning rate: the configured ``base`` times the running boost's factor."""

    def __init__(self, step: TrainStep, start_factor: float = 1.0, start_steps: int = 0):
        self.step = step
        self.base = self.current  # the configured rate, before any boost
        self.boost = LrBoost()
        if start_factor > 1:
            self.start_boost(start_factor, start_steps, decays=True)

    @property
    def current(self) -> float:
        """The learning rate the next step runs at (the step assigns it to the optimizer in
        its graph, so the optimizer's variable holds the last step's)."""
        if self.step.learning_rate is not None:
            return self.step.learning_rate
        return float(np.asarray(self.step.model.optimizer.learning_rate))

    @property
    def factor(self) -> float:
        """The rate's current multiple of the configured one (1 outside boosts)."""
        return self.boost.factor()

    def set(self, value: float) -> None:
        if self.step.learning_rate is not None:
            self.step.learning_rate = value  # assigned in the step's graph
        else:  # a learning-rate schedule: not an input of the step
            self.step.model.optimizer.learning_rate = value

    def start_boost(self, peak: float, steps: int, decays: bool) -> None:
        """Multiply the rate by ``peak`` for ``steps`` steps from the next on."""
        self.boost = LrBoost(peak, steps, decays)
        self.set(self.base * self.boost.factor())

    def end_boost(self) -> None:
        """Back to the configured rate now (a model restored from a checkpoint is not
        fresh)."""
        if self.boost.left > 0:
            self.boost = LrBoost()
            self.set(self.base)

    def after_step(self) -> None:
        """One applied step: the boost moves on."""
        if self.boost.left > 0:
            self.boost.left -= 1
            self.set(self.base * self.boost.factor())

    def point(self) -> RatePoint:
        return RatePoint(copy.copy(self.boost), self.step.learning_rate)

    def restore_point(self, point: RatePoint) -> None:
        self.boost = point.boost
        if point.rate is not None:
            self.step.learning_rate = point.rate
