"""The score of the predictions actually served, from joined (prediction, label) pairs.

The trainer's prequential score asks how well the trainer's current weights predict a sample
just before learning it. This one asks what users got: each pair is the prediction a serving
process answered (with whatever version it held then) against the label that arrived later.
Classifiers get ``accuracy`` (argmax over the last axis, or 0.5 on a single sigmoid output;
sparse targets are class indices), everything else ``mae`` and ``mse``. Each over a ``sliding``
window of the last ``window`` pairs and ``cumulative`` since the process started. Memory is
bounded by the window.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class ServedScore:
    """Sliding and cumulative served metrics of one model."""

    def __init__(self, classification: bool, sparse: bool, window: int = 1000) -> None:
        self.classification = classification
        self.sparse = sparse
        self.metrics = ("accuracy",) if classification else ("mae", "mse")
        self._recent: dict[str, deque[float]] = {m: deque(maxlen=window) for m in self.metrics}
        self._sums = dict.fromkeys(self.metrics, 0.0)
        self.count = 0

    def add(self, served: np.ndarray, label: np.ndarray) -> None:
        """Score one served prediction against its label."""
        for metric, value in self._pair(served, label).items():
            self._recent[metric].append(value)
            self._sums[metric] += value
        self.count += 1

    def values(self) -> dict[tuple[str, str], float]:
        """{(metric, window): value}; empty before the first pair."""
        if not self.count:
            return {}
        found = {}
        for metric in self.metrics:
            recent = self._recent[metric]
            found[(metric, "sliding")] = sum(recent) / len(recent)
            found[(metric, "cumulative")] = self._sums[metric] / self.count
        return found

    def _pair(self, served: np.ndarray, label: np.ndarray) -> dict[str, float]:
        p = np.asarray(served, dtype=np.float64).reshape(-1)
        y = np.asarray(label, dtype=np.float64).reshape(-1)
        if not self.classification:
            error = p - y if p.shape == y.shape else p.mean() - y.mean()
            return {"mae": float(np.abs(error).mean()), "mse": float(np.square(error).mean())}
        if self.sparse:
            predicted = int(np.argmax(p)) if p.size > 1 else int(p[0] >= 0.5)
            return {"accuracy": float(predicted == int(y[0]))}
        if p.size == 1:
            return {"accuracy": float((p[0] >= 0.5) == (y[0] >= 0.5))}
        if p.shape == y.shape and y.size > 1 and np.isclose(y.sum(), 1.0):  # one-hot
            return {"accuracy": float(np.argmax(p) == np.argmax(y))}
        return {"accuracy": float(np.all((p >= 0.5) == (y >= 0.5)))}  # multi-label
