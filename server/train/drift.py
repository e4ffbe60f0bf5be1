"""Concept-drift detection on the stream of prequential (test-then-train) per-sample losses.

A lasting rise in the loss of samples the model has not trained on yet means the stream changed;
the trainer can then react (log it, count it, refresh replay, raise the learning rate).

Decision: Page-Hinkley is implemented here, in numpy; ADWIN comes from River when it is
installed (``pip install river``: a dev dependency, not a runtime one). Why not River for both:
River brings SciPy (~110 MB) into a server that otherwise needs neither, and its detectors take
one float per Python call, while ours takes a whole minibatch of losses in a few numpy
cumulative sums. With ``standardize=False, clip=None, mode="up"`` and River's numbers
(``delta=0.005, threshold=50, alpha=1 - 1e-4``) ours signals exactly where
``river.drift.PageHinkley(mode="up")`` does (the tests check this).

Our defaults differ from River's, for three reasons:
- ``standardize=True``: deviations from the running mean are measured in running standard
  deviations (both since the last detection), so ``delta`` and ``threshold`` mean the same for
  a loss of order 0.01 and one of order 1000; River's are in loss units.
- ``alpha=1`` (no fading): in standard units River's fading factor lets the sum settle with a
  spread beyond the threshold, so stationary losses raise false alarms.
- ``clip=5`` (standard deviations): heavy-tailed losses (log-normal, cross-entropy) otherwise
  raise false alarms from a few outliers close together.
With the defaults (``delta=0.2, threshold=50, min_instances=30``) stationary losses of six
distributions raise no false alarm while a jump is found within a batch or two; the probes are in
docs/benchmarks/defaults.md ("Drift detector"). ``mode="up"``: a model that gets better is not
drift. A model learning a noiseless stream is not drift either: its loss falls by orders of
magnitude and the deviations from the running mean (which keeps the early, larger losses) stay
negative (``tests/unit/train/test_update_policy.py`` checks it on a 30,000-sample stream). A
transient rise of the loss after an optimizer's overshoot is a real rise and is reported as one; the
default reaction (``flush_replay``) then costs the next few steps their replayed samples only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

DriftMethod = Literal["page_hinkley", "adwin"]
Direction = Literal["up", "down", "both"]

# Longest stretch computed with one closed-form fading sum: alpha**-L stays below e**10, so
# the rounding error of the closed form stays near 1e-11 relative.
_MAX_CHUNK = 1024


@dataclass(slots=True)
class _PHState:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    sum_up: float = 0.0  # cumulative sum of (deviation - delta), faded by alpha
    min_up: float = math.inf
    sum_down: float = 0.0  # cumulative sum of (deviation + delta), faded by alpha
    max_down: float = -math.inf


class PageHinkley:
    """Page-Hinkley test (a CUSUM) on the deviations of the values from their running mean.

    Drift "up" is signalled at the first value where ``sum_up - min(sum_up) > threshold``, with
    ``sum_up_t = alpha * sum_up_(t-1) + dev_t - delta`` (mode "down" mirrors it), and not
    before ``min_instances`` values since the last detection. ``dev_t`` is the value minus the
    running mean (including it); with ``standardize`` it is divided by the running standard
    deviation and then clipped to ``[-clip, clip]``. ``delta`` is the change too small to care
    about, ``threshold`` (lambda) trades detection delay for false alarms.
    """

    def __init__(
        self,
        delta: float = 0.2,
        threshold: float = 50.0,
        alpha: float = 1.0,
        min_instances: int = 30,
        mode: Direction = "up",
        standardize: bool = True,
        clip: float | None = 5.0,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if mode not in ("up", "down", "both"):
            raise ValueError(f"mode must be 'up', 'down' or 'both', got {mode!r}")
        self.delta = delta
        self.threshold = threshold
        self.alpha = alpha
        self.min_instances = max(1, int(min_instances))
        self.mode: Direction = mode
        self.standardize = standardize
        self.clip = clip
        self._chunk = _MAX_CHUNK
        if alpha < 1.0:
            self._chunk = max(1, min(_MAX_CHUNK, int(10 / -math.log(alpha))))
        self._s = _PHState()
        self._steps_memo: np.ndarray | None = None

    def reset(self) -> None:
        self._s = _PHState()

    def update(self, values: np.ndarray) -> list[int]:
        """Feed values in order; the indices (into ``values``) at which drift was signalled.

        After each detection the test starts afresh from the next value.
        """
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        found: list[int] = []
        start = 0
        while start < len(values):
            chunk = values[start : start + self._chunk]
            hit = self._run(chunk)
            if hit is None:
                start += len(chunk)
            else:
                found.append(start + hit)
                self.reset()
                start += hit + 1
        return found

    def _run(self, x: np.ndarray) -> int | None:
        """Advance over ``x``; on a detection return its index (state is then stale).

        Runs once per training step, so it is written for few numpy calls, in place where an
        array is not needed again (the gain: docs/benchmarks/trainer.md). Each value goes
        through the same operations in the same order as before that rewrite, so detections and
        state are the same to the bit (checked on 12,000 random batches of 1 to 3,000 values,
        every mode, with and without standardizing).
        """
        s = self._s
        n = len(x)
        count = self._steps(n) + s.n
        pivot = s.mean if s.n else float(x[0])
        centred = x - pivot
        s1 = np.cumsum(centred)
        mean = s1 / count
        mean += pivot
        dev = x - mean
        np.multiply(centred, centred, out=centred)
        m2 = np.cumsum(centred)
        m2 += s.m2
        s1 *= s1
        s1 /= count
        m2 -= s1
        if self.standardize:
            std = np.maximum(m2, 0.0)
            std /= count
            np.sqrt(std, out=std)
            if std.min() > 0:
                dev /= std
            else:  # a zero (or NaN) spread: no deviation there
                dev = np.divide(dev, std, out=np.zeros_like(dev), where=std > 0)
            if self.clip is not None:
                np.maximum(dev, -self.clip, out=dev)
                np.minimum(dev, self.clip, out=dev)
        # Only the directions the mode watches (the other's sums stay at their start).
        new = _PHState(n=s.n + n, mean=float(mean[-1]), m2=float(m2[-1]))
        # no alarm before min_instances values since the start: count >= min_instances
        first = max(0, self.min_instances - s.n - 1)
        hits: list[int | None] = []
        if self.mode in ("up", "both"):
            sum_up = self._fading_sum(s.sum_up, dev - self.delta)
            min_up = np.minimum(sum_up, s.min_up)
            np.minimum.accumulate(min_up, out=min_up)
            hits.append(_first_over(sum_up - min_up, self.threshold, first))
            new.sum_up, new.min_up = float(sum_up[-1]), float(min_up[-1])
        if self.mode in ("down", "both"):
            sum_down = self._fading_sum(s.sum_down, dev + self.delta)
            max_down = np.maximum(sum_down, s.max_down)
            np.maximum.accumulate(max_down, out=max_down)
            hits.append(_first_over(max_down - sum_down, self.threshold, first))
            new.sum_down, new.max_down = float(sum_down[-1]), float(max_down[-1])
        found = [hit for hit in hits if hit is not None]
        if found:
            return min(found)
        self._s = new
        return None

    def _steps(self, n: int) -> np.ndarray:
        """1.0 to n (float64), kept for the last length asked: batches repeat their size."""
        steps = self._steps_memo
        if steps is None or len(steps) != n:
            steps = np.arange(1, n + 1, dtype=np.float64)
            steps.flags.writeable = False
            self._steps_memo = steps
        return steps

    def _fading_sum(self, start: float, steps: np.ndarray) -> np.ndarray:
        """``s_t = alpha * s_(t-1) + steps_t`` for every t, in closed form."""
        if self.alpha == 1.0:
            sums = np.cumsum(steps)
            sums += start
            return sums
        power = self.alpha ** np.arange(1, len(steps) + 1, dtype=np.float64)
        return power * (start + np.cumsum(steps / power))


def _first_over(values: np.ndarray, threshold: float, first: int) -> int | None:
    """The first index from ``first`` on where ``values`` is above ``threshold``, or None."""
    over = values[first:] > threshold
    if not over.any():
        return None
    return first + int(np.argmax(over))


class _RiverDetector:
    """A River drift detector fed one value at a time (River resets itself after a drift)."""

    def __init__(self, detector: Any) -> None:
        self._detector = detector

    def reset(self) -> None:
        self._detector = self._detector.clone()

    def update(self, values: np.ndarray) -> list[int]:
        found = []
        for i, value in enumerate(np.asarray(values, dtype=np.float64).reshape(-1).tolist()):
            self._detector.update(value)
            if self._detector.drift_detected:
                found.append(i)
        return found


def _adwin(params: dict[str, Any]) -> _RiverDetector:
    try:
        from river.drift import ADWIN
    except ImportError as exc:
        raise ImportError(
            "drift method 'adwin' needs River: pip install river (or use 'page_hinkley')"
        ) from exc
    return _RiverDetector(ADWIN(**params))


class DriftDetector:
    """Watches per-sample losses; ``update`` says whether drift was detected in a batch.

    ``method="page_hinkley"`` (default, numpy): parameters of ``PageHinkley``.
    ``method="adwin"`` (needs River): parameters of ``river.drift.ADWIN``; its defaults are
    ``delta=0.002``, ``clock=32``, ``min_window_length=5``, ``grace_period=10``.
    Non-finite losses (a diverged step) are skipped, so that they cannot poison the statistics.
    """

    def __init__(self, method: DriftMethod = "page_hinkley", **params: Any) -> None:
        self.method = method
        if method == "page_hinkley":
            self._detector: PageHinkley | _RiverDetector = PageHinkley(**params)
        elif method == "adwin":
            self._detector = _adwin(params)
        else:
            raise ValueError(f"drift method must be 'page_hinkley' or 'adwin', got {method!r}")
        self.detections = 0  # drifts detected so far
        self.samples_seen = 0  # finite losses fed so far
        self.last_detection_at: int | None = None  # samples_seen index of the newest drift

    def update(self, losses: np.ndarray) -> bool:
        """Feed a batch of per-sample losses in stream order; True if drift was detected in it.

        The detector restarts after each detection (from the next loss on).
        """
        losses = np.asarray(losses, dtype=np.float64).reshape(-1)
        finite = np.isfinite(losses)
        if not finite.all():
            losses = losses[finite]
        found = self._detector.update(losses)
        if found:
            self.detections += len(found)
            self.last_detection_at = self.samples_seen + found[-1]
        self.samples_seen += len(losses)
        return bool(found)

    def reset(self) -> None:
        """Start the test afresh (counters stay), e.g. after the first steps of training.

        The statistics run since the last detection, so the fast fall of the loss while a
        fresh model learns widens the running spread and slows detection until diluted.
        """
        self._detector.reset()
