"""Running per-feature standardisation of model inputs, learnt from the stream itself.

Online learners standardise features with statistics that grow with the stream (River's
``preprocessing.StandardScaler``). ``RunningStandardizer`` does that per minibatch: it merges each
batch's (count, mean, M2) into the running state with Chan et al.'s parallel algorithm, in
float64, around a shift (the first batch's mean), so that the result equals a two-pass mean
and variance over everything seen so far to ~1e-10 relative or better, also for values around
1e9 with a spread of 1.

One owner (the trainer thread) calls ``update``; ``state()`` and ``mean_std()`` return copies
that can leave that thread (snapshots, checkpoints, a serving model's normalisation layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

_F64_EPS = float(np.finfo(np.float64).eps)
_IQR_PER_STD = 1.3489795  # a normal distribution's interquartile range, in standard deviations
# The 5 % quantiles of the chi-square distribution with 1 to 8 degrees of freedom: below
# SMALL_COUNT values a standard deviation is raised to its 95 % upper confidence bound,
# sqrt(m2 / q[n - 1]) for n values (see RunningStandardizer._std).
_CHI2_05 = (0.0039321, 0.102587, 0.351846, 0.710723, 1.145476, 1.635383, 2.167350, 2.732637)
SMALL_COUNT = len(_CHI2_05) + 2  # counts 2 to 9: 1 to 8 degrees of freedom
# Below this many values the outlier bound is widened by ROBUST_COUNT / count: the start of a
# stream is often not like the rest (ChickWeights' first 50 targets put the next ones up to
# 12.4 standard deviations away; after 100 values none of the learning benchmark's regression
# targets lies beyond 5.5).
ROBUST_COUNT = 100
# SHIFT_RUN of the last SHIFT_WINDOW targets beyond the outlier bound on the same side are a
# new level, not outliers (see LevelShiftWatch).
SHIFT_WINDOW = 32
SHIFT_RUN = 20


class RunningStandardizer:
    """Per-feature running mean and variance; ``transform`` maps x to (x - mean) / std.

    Inputs have shape ``(n, *input_shape)``. The statistics have shape ``input_shape``, or with
    ``per_last_axis=True`` shape ``(input_shape[-1],)``: one mean and variance per feature F of
    a sequence input ``[T, F]``, pooled over time steps (what an LSTM input needs: the same
    feature is scaled alike at every step). The variance is the population variance (ddof=0).
    """

    def __init__(self, per_last_axis: bool = False, eps: float = 1e-12) -> None:
        """``eps`` is added to the variance before the square root, only against blow-ups.

        Features whose variance is zero up to rounding are centred and left unscaled (std 1),
        by scikit-learn's test for constant features. Over fewer than ``SMALL_COUNT`` (10)
        values the standard deviation used is its 95 % upper confidence bound: one estimated
        from 2 values is below a tenth of the true one about one time in nine, and inputs
        (or targets) divided by it come out tens of times too large for the next batch, whose
        gradients then hold Adam-like optimizers' second moments up for hundreds of steps.
        ``mean``, ``variance`` and ``state`` are the plain statistics whatever the count.
        """
        self.per_last_axis = per_last_axis
        self.eps = eps
        self._count = 0
        self._shift: np.ndarray | None = None  # subtracted first, so that sums stay small
        self._mean: np.ndarray | None = None  # mean of (x - shift)
        self._m2: np.ndarray | None = None
        self._bounds: tuple[float, tuple[np.ndarray, np.ndarray]] | None = None  # (k, bounds)
        self._std_memo: np.ndarray | None = None  # _std() until the next update

    @property
    def count(self) -> int:
        """How many values each statistic is over: samples, or samples x time steps."""
        return self._count

    def _reduce_axes(self, ndim: int) -> tuple[int, ...]:
        if ndim < 2:
            raise ValueError(f"expected a batch of shape (n, *input_shape), got {ndim} axes")
        return tuple(range(ndim - 1)) if self.per_last_axis else (0,)

    def update(self, x: np.ndarray) -> None:
        """Merge the batch ``x`` of shape ``(n, *input_shape)`` into the running statistics.

        Runs once or twice per training step, so it is written for few numpy calls (about
        25 us for 256 x 8 values, against 65 us with ``mean``/``square``): reductions over the
        rows of a 2-D view, and the batch's sum of squares about its own mean.
        """
        x = np.asarray(x)
        self._reduce_axes(x.ndim)  # checks the rank
        self._bounds = self._std_memo = None
        features = x.shape[-1:] if self.per_last_axis else x.shape[1:]
        rows = x.reshape(-1, *features) if self.per_last_axis else x
        n_b = rows.shape[0]
        if n_b == 0:
            return
        if self._shift is None:
            self._shift = rows.sum(axis=0, dtype=np.float64) / n_b
        if features != self._shift.shape:
            raise ValueError(
                f"batch features have shape {features}, the running statistics "
                f"{self._shift.shape}: every batch must have the same input shape"
            )
        centred = np.subtract(rows, self._shift, dtype=np.float64)
        mean_b = centred.sum(axis=0) / n_b
        centred -= mean_b
        m2_b = np.einsum("i...,i...->...", centred, centred)
        if self._mean is None or self._m2 is None:
            self._count, self._mean, self._m2 = n_b, mean_b, m2_b
            return
        n_a = self._count
        n = n_a + n_b
        delta = mean_b - self._mean
        self._mean = self._mean + delta * (n_b / n)
        self._m2 = self._m2 + m2_b + delta * delta * (n_a * n_b / n)
        self._count = n

    def bounds(self, k: float) -> tuple[np.ndarray, np.ndarray] | None:
        """``(mean - k * std, mean + k * std)`` per feature (float64): beyond it a value is an
        outlier. Over fewer than ``ROBUST_COUNT`` values ``k`` is widened by
        ``ROBUST_COUNT / count`` (80 standard deviations over 10 values for k = 8); None while
        the statistics are over fewer than ``SMALL_COUNT`` values, or for ``k <= 0`` (no
        bound). The std is the one ``transform`` divides by (1 for a constant feature)."""
        if k <= 0 or self._count < SMALL_COUNT or self._shift is None or self._mean is None:
            return None
        if self._bounds is not None and self._bounds[0] == k:  # asked twice a batch: once
            return self._bounds[1]
        widen = max(1.0, ROBUST_COUNT / self._count)
        mean, spread = self._shift + self._mean, k * widen * self._std()
        bounds = mean - spread, mean + spread
        self._bounds = k, bounds
        return bounds

    def clip_outliers(self, x: np.ndarray, k: float) -> tuple[np.ndarray, np.ndarray]:
        """``x`` (a batch like ``update``'s) with every value beyond ``bounds(k)`` set to the
        bound it crossed, and which rows (samples) had such a value (a boolean per row).

        Winsorizing before ``update`` bounds what one sample can do to the statistics: it
        moves the mean by at most ``k * std / count`` and the variance by about ``k**2 / count``
        of itself, however far away it was. ``x`` itself is returned when nothing is clipped.
        """
        bounds = self.bounds(k)
        x = np.asarray(x)
        none = np.zeros(x.shape[0], bool)
        if bounds is None or x.shape[0] == 0:
            return x, none
        low, high = bounds
        outside = (x < low) | (x > high)  # NaN is neither: non-finite values are checked apart
        if not outside.any():
            return x, none
        rows = np.asarray(outside.reshape(x.shape[0], -1).any(axis=1))
        clipped = np.clip(x, low, high).astype(x.dtype, copy=False)
        return clipped, rows

    def recentred(self, shift: LevelShift) -> RunningStandardizer:
        """A standardizer over ``shift.count`` values: the shifted features' statistics are
        the new level's, the others' mean and variance stay (only their weight falls, so they
        too follow what comes next sooner)."""
        if self._shift is None or self._mean is None or self._m2 is None:
            raise ValueError("nothing to re-centre: the statistics are empty")
        shape = self._shift.shape
        mean = np.reshape(self._shift + self._mean, -1).copy()
        variance = np.reshape(self._m2 / self._count, -1).copy()
        mean[shift.features], variance[shift.features] = shift.mean, shift.variance
        out = RunningStandardizer(self.per_last_axis, self.eps)
        out._count, out._shift = shift.count, np.reshape(mean, shape)
        out._mean, out._m2 = np.zeros(shape), np.reshape(variance * shift.count, shape)
        return out

    def copy(self) -> RunningStandardizer:
        """An independent copy, cheaply: updates replace the statistics' arrays, never write
        into them, so the copy may share them."""
        out = RunningStandardizer.__new__(RunningStandardizer)
        out.__dict__.update(self.__dict__)
        return out

    @property
    def mean(self) -> np.ndarray | None:
        """The mean per feature (float64), None before any update."""
        if self._shift is None or self._mean is None:
            return None
        return self._shift + self._mean

    @property
    def variance(self) -> np.ndarray | None:
        """The population variance per feature (float64), None before any update."""
        if self._m2 is None:
            return None
        return self._m2 / self._count

    def _std(self) -> np.ndarray:
        """The std ``transform`` divides by; memoised until the next update (the targets'
        statistics are asked for it twice a batch: ``mean_std`` after an update, ``bounds``
        before the next one). Never written into by its callers."""
        if self._std_memo is not None:
            return self._std_memo
        assert self._shift is not None and self._mean is not None and self._m2 is not None
        var = self._m2 / self._count
        # scikit-learn's _is_constant_feature: var within the rounding error of its computation.
        mean = self._shift + self._mean
        bound = self._count * _F64_EPS * var + (self._count * mean * _F64_EPS) ** 2
        constant = var <= bound
        if 2 <= self._count < SMALL_COUNT:  # few values: the upper confidence bound
            var = self._m2 / _CHI2_05[self._count - 2]
        self._std_memo = np.where(constant, 1.0, np.sqrt(var + self.eps))
        return self._std_memo

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)`` as float32 copies, so that ``transform(x) == (x - mean) / std``.

        Both broadcast against a batch ``(n, *input_shape)``, for a normalisation layer in a
        serving model. Before any update: mean 0 and std 1 of shape ``()``, the identity.
        """
        if self._shift is None or self._mean is None:
            return np.zeros((), np.float32), np.ones((), np.float32)
        return (self._shift + self._mean).astype(np.float32), self._std().astype(np.float32)

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Standardise ``x`` (computed in float64, returned as float32); identity before data."""
        if self._shift is None or self._mean is None:
            return np.asarray(x, dtype=np.float32)
        x = np.asarray(x, dtype=np.float64)
        self._reduce_axes(x.ndim)
        return (((x - self._shift) - self._mean) / self._std()).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """The whole state as numpy arrays (copies), e.g. for safetensors in a checkpoint.

        Keys: ``count`` (int64, shape ()), ``mean`` and ``m2`` (float64, the statistics' shape,
        or shape (0,) before any update), ``per_last_axis`` (bool, shape ()).
        """
        mean, empty = self.mean, np.zeros(0, np.float64)
        return {
            "count": np.array(self._count, dtype=np.int64),
            "mean": empty if mean is None else mean,
            "m2": empty if self._m2 is None else self._m2.copy(),
            "per_last_axis": np.array(self.per_last_axis, dtype=np.bool_),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray], eps: float = 1e-12) -> RunningStandardizer:
        """Rebuild a standardizer from ``state()``: it goes on where that one stood.

        Its transform is the same; later updates agree to float64 rounding (the shift restarts
        at the saved mean).
        """
        out = cls(per_last_axis=bool(state["per_last_axis"]), eps=eps)
        count = int(state["count"])
        if count > 0:
            mean = np.array(state["mean"], dtype=np.float64)
            m2 = np.array(state["m2"], dtype=np.float64)
            if mean.shape != m2.shape:
                raise ValueError(f"mean {mean.shape} and m2 {m2.shape} differ in shape")
            out._count, out._shift, out._mean, out._m2 = count, mean, np.zeros_like(mean), m2
        return out


@dataclass(frozen=True, slots=True)
class LevelShift:
    """A change of level of some target features, seen by ``LevelShiftWatch``.

    ``features`` index the flattened statistics; ``mean`` and ``variance`` (one per such
    feature) are the new level's, robustly (median, interquartile range), over the ``count``
    recent targets beyond the bound; ``side`` is +1 (above) or -1 (below) per feature.
    """

    features: np.ndarray
    side: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    count: int


class LevelShiftWatch:
    """Tells a change of level from outliers in a stream of targets.

    An outlier is one target beyond the bound; a new level is a run: ``run`` (20) of the last
    ``window`` (32) finite targets of a feature beyond the bound on the same side. A stationary
    stream puts a value beyond 8 standard deviations of its own statistics about once in 1e15
    (Gaussian), and never most of 32 in a row, so the run is the stream moving; clipping it
    would hold the model at the old level for thousands of samples. ``observe`` returns the
    shift to re-centre on (then starts a new window), else None. One owner, like the scaler.
    """

    def __init__(self, window: int = SHIFT_WINDOW, run: int = SHIFT_RUN) -> None:
        if not 0 < run <= window:
            raise ValueError(f"need 0 < run <= window, got run {run}, window {window}")
        self.window, self.run = window, run
        self._values: np.ndarray | None = None  # (m <= window, features) the newest targets
        self._sides: np.ndarray | None = None  # (m, features): +1 above, -1 below, 0 within

    def observe(self, y: np.ndarray, bounds: tuple[np.ndarray, np.ndarray]) -> LevelShift | None:
        """Add a batch of raw targets ``(n, *stats_shape)``, judged against ``bounds``.

        Only the newest ``window`` targets are kept and judged, so only the batch's last
        ``window`` rows are converted and compared (not 256-1,024 rows a batch). While no kept
        target lies beyond the bound (the usual case), nothing is kept: only targets beyond it
        count towards a run or its statistics, so a batch with none beyond it costs one
        comparison, not the full pass (docs/benchmarks/defaults.md).
        """
        recent = np.asarray(y)[-self.window :]
        rows = np.asarray(recent, dtype=np.float64).reshape(len(recent), -1)
        low, high = (np.reshape(b, -1) for b in bounds)
        if self._sides is None and not ((rows > high) | (rows < low)).any():
            return None  # NaN compares False: non-finite values never make a level either
        finite = np.isfinite(rows)  # inf or NaN never make a level
        sides = np.where(finite & (rows > high), 1, np.where(finite & (rows < low), -1, 0))
        if self._values is not None and self._sides is not None:
            rows, sides = np.concatenate([self._values, rows]), np.concatenate([self._sides, sides])
        self._values, self._sides = rows[-self.window :], sides[-self.window :].astype(np.int8)
        if not self._sides.any():  # nothing beyond the bound is left in the window
            self._values = self._sides = None
            return None
        above, below = (self._sides == 1).sum(axis=0), (self._sides == -1).sum(axis=0)
        features = np.flatnonzero((above >= self.run) | (below >= self.run))
        if features.size == 0:
            return None
        side = np.where(above[features] >= self.run, 1, -1)
        mean, variance, counts = [], [], []
        for f, s in zip(features.tolist(), side.tolist(), strict=True):
            values = self._values[self._sides[:, f] == s, f]
            q1, median, q3 = np.percentile(values, [25, 50, 75])
            sigma = (q3 - q1) / _IQR_PER_STD
            mean.append(median)
            variance.append(sigma * sigma)
            counts.append(len(values))
        self._values = self._sides = None
        return LevelShift(features, side, np.array(mean), np.array(variance), min(counts))
