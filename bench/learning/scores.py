"""One learner's prequential (test-then-train) figures on a stream, and their course over it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.learning.streams import CHUNK


@dataclass(slots=True)
class Score:
    """One learner's test-then-train figures on one stream: accuracy and log loss for a
    classifier, MAE and RMSE for a regressor (the others NaN)."""

    accuracy: float
    log_loss: float
    samples: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)  # steps, batch sizes, drift detections
    per_sample: np.ndarray | None = None  # 1.0 where right, or the absolute error (not in JSON)
    mae: float = math.nan
    rmse: float = math.nan

    def value(self, metric: str) -> float:
        """The stream's figure: ``accuracy`` or ``mae``."""
        return float(self.accuracy if metric == "accuracy" else self.mae)

    @property
    def mae_after_first_message(self) -> float:
        """MAE over the samples after the first message (a minibatch learner predicts the whole
        first message before it has seen a label); NaN for a classifier or without per-sample
        errors."""
        return math.nan if math.isnan(self.mae) else self.after_first_message

    @property
    def after_first_message(self) -> float:
        """The stream's figure (accuracy, or MAE for a regressor) over the samples after the
        first message: what a served model's clients got once every message is one batch
        scored by the version before it. NaN without per-sample figures."""
        if self.per_sample is None or len(self.per_sample) <= CHUNK:
            return math.nan
        return float(self.per_sample[CHUNK:].mean())

    def to_json(self) -> dict[str, Any]:
        figures: dict[str, Any]
        if math.isnan(self.mae):
            figures = {"accuracy": self.accuracy, "log_loss": self.log_loss}
        else:
            figures = {"mae": self.mae, "rmse": self.rmse}
            if not math.isnan(self.mae_after_first_message):
                figures["mae_after_first_message"] = self.mae_after_first_message
        return {
            **figures,
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
            **self.extra,
        }


def segment_edges(n: int) -> list[int]:
    """Where the figures over time cut a stream: the first 100 samples, then quarters."""
    return sorted({0, min(100, n), n // 4, n // 2, 3 * n // 4, n})


def segments(per_sample: np.ndarray, edges: Sequence[int]) -> list[float]:
    """Accuracy (or MAE) within each stretch between consecutive ``edges``."""
    return [float(per_sample[a:b].mean()) for a, b in itertools.pairwise(edges) if b > a]
