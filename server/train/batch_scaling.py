"""The online statistics a minibatch is trained with: input scaling, target scaling, outlying
targets and a target's change of level.

Per batch (``UpdatePolicy.start``): a run of targets beyond the outlier bound on one side
completes a new level, and the target statistics are re-centred on it (``follow_level_shift``);
outlying targets are clipped to the bound for the statistics and the scores and trained with
weight 0 (``clip_target_outliers``); then the statistics including the batch are computed for
the step to set after its update (``next_statistics``, ``next_target_statistics``: scoring and
training of the batch use the ones from before it, as a streaming scaler must). A batch whose
step is rolled back takes its statistics back (``roll_back``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import keras
import numpy as np

from livefit.models.standardize import broadcast_statistic, standardize_layer
from livefit.models.target_scaling import target_scaling_layer

from ..wire.samples import Batch
from .scaling import LevelShift, LevelShiftWatch, RunningStandardizer

Statistics = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True)
class ScalingPoint:
    """What ``BatchScaling`` changes while a batch starts, as ``point`` saved it."""

    scaler: RunningStandardizer | None
    target_scaler: RunningStandardizer | None
    saved_scaler: RunningStandardizer | None
    saved_target_scaler: RunningStandardizer | None
    shift_watch: LevelShiftWatch


class BatchScaling:
    """The running statistics of one model's inputs (its ``standardize`` layer) and targets
    (its ``target_scaling`` layer), where the model has them."""

    def __init__(self, model: keras.Model, per_last_axis: bool, target_outlier_std: float):
        self.layer = standardize_layer(model)
        self.scaler = RunningStandardizer(per_last_axis) if self.layer is not None else None
        self.target_layer = target_scaling_layer(model)
        self.target_scaler = RunningStandardizer() if self.target_layer is not None else None
        self.target_outlier_std = target_outlier_std
        self.shift_watch = LevelShiftWatch()
        self._saved_scaler: RunningStandardizer | None = None
        self._saved_target_scaler: RunningStandardizer | None = None

    def follow_level_shift(self, batch: Batch) -> LevelShift | None:
        """Re-centre the target statistics when the batch completes a run of targets beyond
        the outlier bound on one side (a new level); the caller empties the replay buffer,
        which holds the old one."""
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
        return shift

    def clip_target_outliers(self, batch: Batch) -> tuple[Batch, int]:
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

    def next_statistics(self, batch: Batch) -> Statistics | None:
        """The input statistics including ``batch``, for the step to set after its update."""
        if self.scaler is None or self.layer is None:
            return None
        self._saved_scaler = self.scaler.copy()
        self.scaler.update(batch.x)
        mean, std = self.scaler.mean_std()
        shape = self.layer.stats_shape
        return broadcast_statistic(mean, shape), broadcast_statistic(std, shape)

    def next_target_statistics(self, batch: Batch) -> Statistics | None:
        """The targets' statistics including ``batch`` (its new samples only, never replayed
        ones), for the step to set after its update."""
        if self.target_scaler is None or self.target_layer is None:
            return None
        self._saved_target_scaler = self.target_scaler.copy()
        shape = self.target_layer.stats_shape
        self.target_scaler.update(np.reshape(batch.y, (len(batch.y), *shape)))
        mean, std = self.target_scaler.mean_std()
        return broadcast_statistic(mean, shape), broadcast_statistic(std, shape)

    def roll_back(self) -> None:
        """The statistics as before the last batch (its step was rolled back)."""
        if self._saved_scaler is not None:
            self.scaler = self._saved_scaler
        if self._saved_target_scaler is not None:
            self.target_scaler = self._saved_target_scaler

    def point(self) -> ScalingPoint:
        """What starting a batch changes, saved (cheap: the scalers' arrays are never written
        into)."""
        return ScalingPoint(
            None if self.scaler is None else self.scaler.copy(),
            None if self.target_scaler is None else self.target_scaler.copy(),
            self._saved_scaler,
            self._saved_target_scaler,
            copy.copy(self.shift_watch),
        )

    def restore_point(self, point: ScalingPoint) -> None:
        self.scaler, self.target_scaler = point.scaler, point.target_scaler
        self._saved_scaler = point.saved_scaler
        self._saved_target_scaler = point.saved_target_scaler
        self.shift_watch = point.shift_watch

    def state(self) -> dict[str, np.ndarray]:
        """The running statistics, as a checkpoint's extra arrays."""
        state: dict[str, np.ndarray] = {}
        for prefix, scaler in (("scaler_", self.scaler), ("target_scaler_", self.target_scaler)):
            if scaler is not None:
                state.update({f"{prefix}{k}": v for k, v in scaler.state().items()})
        return state

    def restore(self, extra: dict[str, np.ndarray]) -> None:
        """Take the running statistics from a checkpoint's extra arrays, where it has them."""
        if self.scaler is not None and "scaler_count" in extra:
            self.scaler = _restored_scaler(extra, "scaler_")
        if self.target_scaler is not None and "target_scaler_count" in extra:
            self.target_scaler = _restored_scaler(extra, "target_scaler_")


def _restored_scaler(extra: dict[str, np.ndarray], prefix: str) -> RunningStandardizer:
    """The running standardizer saved under ``prefix`` in a checkpoint's extra arrays."""
    state = {k.removeprefix(prefix): v for k, v in extra.items() if k.startswith(prefix)}
    state["count"] = np.asarray(state["count"]).reshape(())
    state["per_last_axis"] = np.asarray(state["per_last_axis"]).reshape(())
    return RunningStandardizer.from_state(state)
