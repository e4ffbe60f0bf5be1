"""How fast a learner wins its accuracy back after a concept drift: from per-sample figures."""

from __future__ import annotations

import numpy as np

WINDOW = 500  # samples: the pre-drift score and the moving score after the drift
MARGIN = 0.01  # within 1 point of the pre-drift accuracy (or 1 % of the pre-drift MAE)


def recovery_samples(
    per_sample: np.ndarray, drift_at: int, higher: bool = True, window: int = WINDOW
) -> int | None:
    """Samples after ``drift_at`` until the mean over the last ``window`` samples (all after
    the drift) is back within ``MARGIN`` of the mean over the ``window`` samples before it;
    None when that never happens in the stream.

    ``higher``: the figure is an accuracy (1.0 right, 0.0 wrong); otherwise an error, where
    "within" means at most ``1 + MARGIN`` times the pre-drift error.
    """
    before = float(np.mean(per_sample[max(0, drift_at - window) : drift_at]))
    after = per_sample[drift_at:]
    if len(after) < window:
        return None
    sums = np.cumsum(np.concatenate([[0.0], after.astype(np.float64)]))
    moving = (sums[window:] - sums[:-window]) / window  # moving[i]: samples i .. i + window
    ok = moving >= before - MARGIN if higher else moving <= before * (1 + MARGIN)
    hits = np.flatnonzero(ok)
    return int(hits[0] + window) if len(hits) else None


def after_drift(per_sample: np.ndarray, drift_at: int, span: int = 1000) -> float:
    """The mean figure over the ``span`` samples after ``drift_at``."""
    return float(np.mean(per_sample[drift_at : drift_at + span]))
