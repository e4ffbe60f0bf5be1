"""A bounded replay buffer of past samples, and ``mix`` to add replayed samples to a batch.

Replaying a share of past samples in every minibatch keeps a streaming learner from forgetting
what it learnt (experience replay). ``mode="reservoir"`` keeps a uniform sample of the whole
stream (Vitter's algorithm R); ``mode="window"`` keeps the most recent ``capacity`` samples.

Order in the trainer: ``mix`` the new batch with the buffer first, train, and only then
``add`` the new batch to the buffer, so that a batch never replays itself. ``mix`` puts the
new samples first, so the first ``n`` per-sample losses are the prequential scores and the
replayed ones (already trained on) must not enter test-then-train metrics.

One owner (the trainer thread); not thread-safe.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

ReplayMode = Literal["reservoir", "window"]


class ReplayBuffer:
    """At most ``capacity`` samples (x, y, w) in arrays allocated once, at the first ``add``.

    Memory is ``capacity`` times the size of one sample, whatever the stream's length.
    """

    def __init__(self, capacity: int, mode: ReplayMode = "reservoir", seed: int | None = None):
        if capacity < 1:
            raise ValueError(f"replay capacity must be at least 1, got {capacity}")
        if mode not in ("reservoir", "window"):
            raise ValueError(f"replay mode must be 'reservoir' or 'window', got {mode!r}")
        self._capacity = capacity
        self.mode: ReplayMode = mode
        self._rng = np.random.default_rng(seed)
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None
        self._w: np.ndarray | None = None
        self._size = 0
        self.seen = 0  # samples offered to the buffer so far

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return self._size

    @property
    def fill_ratio(self) -> float:
        """Stored samples over capacity, in [0, 1]."""
        return self._size / self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated arrays (0 before the first add)."""
        return sum(a.nbytes for a in (self._x, self._y, self._w) if a is not None)

    def clear(self) -> None:
        """Forget every stored sample (the arrays stay allocated); a reservoir starts over."""
        self._size = self.seen = 0

    def _allocate(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        self._x = np.empty((self._capacity, *x.shape[1:]), dtype=x.dtype)
        self._y = np.empty((self._capacity, *y.shape[1:]), dtype=y.dtype)
        self._w = np.empty(self._capacity, dtype=w.dtype)

    def _check(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        n = len(x)
        if len(y) != n or w.shape != (n,):
            raise ValueError(f"x, y, w disagree on the batch size: {x.shape}, {y.shape}, {w.shape}")
        assert self._x is not None and self._y is not None
        if x.shape[1:] != self._x.shape[1:] or y.shape[1:] != self._y.shape[1:]:
            raise ValueError(
                f"sample shapes x{x.shape[1:]} y{y.shape[1:]} differ from the buffer's "
                f"x{self._x.shape[1:]} y{self._y.shape[1:]} (set at the first add)"
            )

    def add(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        """Offer a batch of ``n`` samples; which ones are kept depends on the mode."""
        x, y, w = np.asarray(x), np.asarray(y), np.asarray(w)
        if self._x is None:
            self._allocate(x, y, w)
        self._check(x, y, w)
        n = len(x)
        if n == 0:
            return
        assert self._x is not None and self._y is not None and self._w is not None
        if self.mode == "window":
            self._write_window(x, y, w)
        else:
            rows, slots = self._reservoir_slots(n)
            self._x[slots], self._y[slots], self._w[slots] = x[rows], y[rows], w[rows]
        self.seen += n
        self._size = min(self.seen, self._capacity)

    def _write_window(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        """Ring buffer: the last ``min(n, capacity)`` rows go to the slots after the newest,
        in at most two contiguous slices (fancy indexing with a slot per row cost twice as
        much at 256 rows)."""
        assert self._x is not None and self._y is not None and self._w is not None
        n = len(x)
        first = max(0, n - self._capacity)  # rows before it are overwritten within the batch
        start = (self.seen + first) % self._capacity
        head = min(n - first, self._capacity - start)  # rows before the ring wraps
        for store, rows in ((self._x, x), (self._y, y), (self._w, w)):
            store[start : start + head] = rows[first : first + head]
            store[: n - first - head] = rows[first + head :]

    def _reservoir_slots(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm R, vectorised: sample i (0-based in the stream) goes to slot j ~ U{0..i}.

        Samples before ``capacity`` fill the slots in order; a later one replaces slot j when
        j < capacity. When two rows of a batch draw the same slot, the later row wins, as it
        would one sample at a time.
        """
        index = self.seen + np.arange(n, dtype=np.int64)
        slot = np.where(
            index < self._capacity, index, self._rng.integers(0, index + 1, dtype=np.int64)
        )
        rows = np.flatnonzero(slot < self._capacity)
        slot = slot[rows]
        # Keep the last row per slot: np.unique on the reversed order finds last occurrences.
        _, first_in_reversed = np.unique(slot[::-1], return_index=True)
        last = len(slot) - 1 - first_in_reversed
        return rows[last], slot[last]

    def sample(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``k`` distinct stored samples, uniformly at random (copies). Needs ``k <= len(self)``."""
        if not 0 <= k <= self._size:
            raise ValueError(f"cannot sample {k} from a replay buffer holding {self._size}")
        if self._x is None or self._y is None or self._w is None:
            raise ValueError("the replay buffer is empty: nothing was added yet")
        idx = self._rng.choice(self._size, size=k, replace=False)
        return self._x[idx], self._y[idx], self._w[idx]


def replay_count(n: int, share: float, available: int) -> int:
    """Replayed samples to add to ``n`` new ones: round(share / (1 - share) * n), half up.

    Bounded by ``available``; the replayed share of the combined batch is then ``share`` up to
    rounding, or less while the buffer is short.
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"replay share must be in [0, 1), got {share}")
    return min(available, math.floor(share / (1.0 - share) * n + 0.5))


def mix(
    batch_x: np.ndarray,
    batch_y: np.ndarray,
    batch_w: np.ndarray,
    buffer: ReplayBuffer,
    share: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The new batch followed by replayed samples, and how many were replayed.

    Call before ``buffer.add(batch_...)`` (a batch must not replay itself). The new samples
    keep their order and come first; replayed ones take the batch's dtypes.
    """
    k = replay_count(len(batch_x), share, len(buffer))
    if k == 0:
        return batch_x, batch_y, batch_w, 0
    rx, ry, rw = buffer.sample(k)
    x = np.concatenate([batch_x, rx.astype(batch_x.dtype, copy=False)])
    y = np.concatenate([batch_y, ry.astype(batch_y.dtype, copy=False)])
    w = np.concatenate([batch_w, rw.astype(batch_w.dtype, copy=False)])
    return x, y, w, k
