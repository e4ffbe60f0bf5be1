"""What a ``linear`` model computes from its snapshot weights, in numpy (with or without the
``standardize`` layer in front), to check served numbers against the version that made them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def linear_forward(weights: Sequence[np.ndarray], rows: np.ndarray) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
    if len(weights) == 4:  # standardize/mean, standardize/std, output/kernel, output/bias
        mean, std, kernel, bias = weights
        x = (x - mean.reshape(-1)) / std.reshape(-1)
    else:
        kernel, bias = weights
    return x @ kernel + bias
