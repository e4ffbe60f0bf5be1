"""What a ``linear`` model computes from its snapshot weights, in numpy (with or without the
``standardize`` layer in front, the experts' mixture of the network and the linear expert,
and the ``target_scaling`` layer behind), to check served numbers against the version that
made them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# standardize mean and std, the network's kernel and bias, the linear expert's kernel and
# bias, the mixture's share, recent_error and recent_samples (livefit.models.experts)
WITH_EXPERTS = 9


def linear_forward(
    weights: Sequence[np.ndarray], rows: np.ndarray, target_scaling: bool | None = None
) -> np.ndarray:
    """``target_scaling``: whether the last two weights are the target statistics (None: when
    there are 6 or 11 weights, or 4 with a kernel and bias of a 2-D and a 1-D shape first)."""
    x = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
    weights = list(weights)
    if target_scaling is None:
        target_scaling = len(weights) in (6, WITH_EXPERTS + 2) or (
            len(weights) == 4 and weights[0].ndim == 2
        )
    target = weights[-2:] if target_scaling else None  # target_scaling/mean, target_scaling/std
    if target_scaling:
        weights = weights[:-2]
    if len(weights) == WITH_EXPERTS:
        mean, std, kernel, bias, linear_kernel, linear_bias, share = weights[:7]
        x = (x - mean.reshape(-1)) / std.reshape(-1)
        out = share[0] * (x @ kernel + bias) + share[1] * (x @ linear_kernel + linear_bias)
    else:
        if len(weights) == 4:  # standardize/mean, standardize/std, output/kernel, output/bias
            mean, std, kernel, bias = weights
            x = (x - mean.reshape(-1)) / std.reshape(-1)
        else:
            kernel, bias = weights
        out = x @ kernel + bias
    if target is not None:
        out = out * target[1].reshape(-1) + target[0].reshape(-1)
    return out
