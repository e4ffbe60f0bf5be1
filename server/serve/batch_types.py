"""What goes into and out of the batcher: the model call's signatures (``PredictFn``, and
``PredictVersionFn`` for a past version), a request's answer (``Prediction``) or its
``DeadlineExceeded``, and the report after each model call (``BatchStats``).

This module owns these plain types and nothing else; ``batcher`` uses them, and callers import
them from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..wire.snapshot import Snapshot

PredictFn = Callable[[np.ndarray], tuple[np.ndarray, int]]
# A call with a kept past version's weights (``ServingModel.predict_version``): the rows and
# the snapshot of that version, whose version it returns.
PredictVersionFn = Callable[[np.ndarray, Snapshot], tuple[np.ndarray, int]]


class DeadlineExceeded(Exception):
    """The request's deadline passed before it was served (HTTP 504)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """What a request gets back: its own rows' outputs and the version that computed them."""

    outputs: np.ndarray
    version: int
    queue_seconds: float


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Reported after each model call: rows, requests, and how long the call took."""

    rows: int
    requests: int
    seconds: float
    queue_seconds: list[float]
