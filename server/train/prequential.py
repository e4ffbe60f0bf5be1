"""Test-then-train scores: each sample is scored by the model before the model trains on it."""

from __future__ import annotations

from collections import deque

import numpy as np


class WindowedMean:
    """Mean of the last ``window`` values (whole batches dropped from the old end) and overall."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._batches: deque[tuple[float, int]] = deque()
        self._sum = 0.0
        self._count = 0
        self.total_sum = 0.0
        self.total_count = 0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if values.size > self.window:
            values = values[-self.window :]
        batch_sum, batch_count = float(values.sum()), int(values.size)
        self._batches.append((batch_sum, batch_count))
        self._sum += batch_sum
        self._count += batch_count
        self.total_sum += batch_sum
        self.total_count += batch_count
        while self._count - self._batches[0][1] >= self.window:
            old_sum, old_count = self._batches.popleft()
            self._sum -= old_sum
            self._count -= old_count

    @property
    def value(self) -> float:
        """The windowed mean (NaN before the first value)."""
        return self._sum / self._count if self._count else float("nan")

    @property
    def cumulative(self) -> float:
        return self.total_sum / self.total_count if self.total_count else float("nan")

    def batches(self) -> np.ndarray:
        """The window's batches, oldest first, as a (batches, 2) array of (sum, count)."""
        return np.array(self._batches, dtype=np.float64).reshape(-1, 2)

    @classmethod
    def from_batches(cls, window: int, batches: np.ndarray) -> WindowedMean:
        """A mean over ``window`` holding ``batches`` (as ``batches()`` returns them): the same
        windowed value; the cumulative one counts those batches only.

        ``batches`` comes from a checkpoint, so it is checked, not trusted: a ValueError unless
        it is numeric with (sum, count) pairs, at most ``window`` of them, each count a whole
        number from 1 to ``window`` and no sum NaN.
        """
        array = np.asarray(batches)
        if array.dtype.kind not in "fiu" or array.size % 2 or array.size > 2 * window:
            raise ValueError(
                f"not a window's (sum, count) pairs: dtype {array.dtype}, {array.size} values"
            )
        pairs = array.astype(np.float64).reshape(-1, 2)
        sums, counts = pairs[:, 0], pairs[:, 1]
        if np.isnan(sums).any():
            raise ValueError("a batch's loss sum is NaN")
        if (
            not (np.isfinite(counts) & (counts >= 1) & (counts <= window)).all()
            or (counts != np.floor(counts)).any()
        ):
            raise ValueError(f"batch counts must be whole numbers from 1 to {window}")
        mean = cls(window)
        for batch_sum, batch_count in pairs:
            mean._batches.append((float(batch_sum), int(batch_count)))
            mean._sum += float(batch_sum)
            mean._count += int(batch_count)
        mean.total_sum, mean.total_count = mean._sum, mean._count
        return mean


def correct_predictions(y_true: np.ndarray, y_pred: np.ndarray, sparse: bool) -> np.ndarray:
    """1.0 where a classifier's prediction is right: argmax for several outputs, 0.5 for one."""
    n = y_pred.shape[0]
    pred = y_pred.reshape(n, -1)
    if sparse:
        return (pred.argmax(axis=1) == y_true.reshape(n).astype(np.int64)).astype(np.float32)
    true = y_true.reshape(n, -1)
    if pred.shape[1] == 1:
        return ((pred[:, 0] > 0.5) == (true[:, 0] > 0.5)).astype(np.float32)
    return (pred.argmax(axis=1) == true.argmax(axis=1)).astype(np.float32)


class PrequentialScores:
    """Test-then-train scores of one model, each over a sliding window and cumulatively.

    Always ``loss`` (the training loss function); for classifiers ``accuracy`` and ``log_loss``
    (the cross-entropy of the predicted probabilities), for regression ``mse`` and ``mae``.
    """

    def __init__(self, window: int, classification: bool, sparse: bool) -> None:
        self.classification = classification
        self.sparse = sparse
        names = ("loss", "accuracy", "log_loss") if classification else ("loss", "mse", "mae")
        self.scores = {name: WindowedMean(window) for name in names}

    def add(self, losses: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray) -> None:
        """Add a batch scored before training: per-sample losses, targets and predictions."""
        self.scores["loss"].add(losses)
        if self.classification:
            self.scores["accuracy"].add(correct_predictions(y_true, y_pred, self.sparse))
            self.scores["log_loss"].add(log_loss(y_true, y_pred, self.sparse))
        else:
            # in float64: a float32 error of 1e20 would square to infinity
            error = np.subtract(
                y_pred.reshape(len(y_pred), -1), y_true.reshape(len(y_true), -1), dtype=np.float64
            )
            if error.shape[1] == 1:  # one output: the same values without two row means
                error = error[:, 0]
                self.scores["mse"].add(error * error)
                self.scores["mae"].add(np.abs(error))
                return
            self.scores["mse"].add((error**2).mean(axis=1))
            self.scores["mae"].add(np.abs(error).mean(axis=1))


def log_loss(y_true: np.ndarray, y_pred: np.ndarray, sparse: bool, eps: float = 1e-7) -> np.ndarray:
    """Per-sample cross-entropy of predicted probabilities (clipped), binary or categorical."""
    n = y_pred.shape[0]
    p = np.clip(y_pred.reshape(n, -1).astype(np.float64), eps, 1 - eps)
    if sparse:
        return -np.log(p[np.arange(n), y_true.reshape(n).astype(np.int64)])
    t = y_true.reshape(n, -1)
    if p.shape[1] == 1:
        return -(t[:, 0] * np.log(p[:, 0]) + (1 - t[:, 0]) * np.log(1 - p[:, 0]))
    return -(t * np.log(p)).sum(axis=1)
