"""ReplayBuffer and mix: bounded memory, a uniform reservoir, an exact window, exact shares.

Every sample carries its stream position as x, y and w, so a test can tell what was kept and
that the three arrays stayed aligned.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest

from livefit.server.train.replay import ReplayBuffer, ReplayMode, mix, replay_count


def _batch(start: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.arange(start, start + n)
    x = np.repeat(ids[:, None, None], 6, axis=2).reshape(n, 2, 3).astype(np.float32)
    return x, ids.astype(np.float32)[:, None], ids.astype(np.float32)


def _stored_ids(buffer: ReplayBuffer) -> np.ndarray:
    x, y, w = buffer.sample(len(buffer))
    ids = x[:, 0, 0]
    assert (x == ids[:, None, None]).all() and (y[:, 0] == ids).all() and (w == ids).all()
    return ids.astype(np.int64)


def _feed(buffer: ReplayBuffer, sizes: list[int]) -> None:
    start = 0
    for n in sizes:
        buffer.add(*_batch(start, n))
        start += n


@pytest.mark.parametrize("mode", ["reservoir", "window"])
def test_memory_is_bounded_over_a_long_stream(mode: ReplayMode) -> None:
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(50, mode, seed=1)
    assert len(buffer) == 0 and buffer.fill_ratio == 0.0 and buffer.nbytes == 0
    start = 0
    for n in [1, 0, 120, *rng.integers(1, 80, 300).tolist()]:
        buffer.add(*_batch(start, n))
        start += n
        assert len(buffer) == min(start, 50)
        assert buffer.nbytes == 50 * (6 * 4 + 4 + 4)
    assert buffer.seen == start
    assert buffer.fill_ratio == 1.0
    assert buffer.capacity == 50
    assert len(set(_stored_ids(buffer).tolist())) == 50


def test_reservoir_keeps_a_uniform_sample_of_the_stream() -> None:
    # 400 runs of a 2,000-sample stream in batches of varying size, 40 kept each: where in the
    # stream the kept samples came from must be uniform (chi-square over 10 deciles, 9 dof).
    stream, capacity, runs = 2000, 40, 400
    counts = np.zeros(10)
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        sizes = np.diff([0, *np.sort(rng.choice(np.arange(1, stream), 30, replace=False)), stream])
        buffer = ReplayBuffer(capacity, "reservoir", seed=seed)
        _feed(buffer, sizes.tolist())
        counts += np.bincount(_stored_ids(buffer) * 10 // stream, minlength=10)
    expected = capacity * runs / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.88, (chi2, counts)  # p = 0.001


def test_reservoir_from_one_batch_larger_than_capacity_is_uniform() -> None:
    # The fill and the replacements happen in one vectorised add, with repeated slots.
    counts = np.zeros(10)
    for seed in range(400):
        buffer = ReplayBuffer(30, "reservoir", seed=seed)
        buffer.add(*_batch(0, 300))
        counts += np.bincount(_stored_ids(buffer) // 30, minlength=10)
    expected = 30 * 400 / 10
    assert float(((counts - expected) ** 2 / expected).sum()) < 27.88, counts


def test_window_keeps_exactly_the_most_recent_samples() -> None:
    rng = np.random.default_rng(2)
    buffer = ReplayBuffer(64, "window", seed=3)
    start = 0
    for n in [1, 5, 200, 64, 63, *rng.integers(1, 100, 100).tolist()]:
        buffer.add(*_batch(start, n))
        start += n
        kept = np.sort(_stored_ids(buffer))
        np.testing.assert_array_equal(kept, np.arange(max(0, start - 64), start))


def test_window_puts_stream_sample_i_in_slot_i_modulo_capacity() -> None:
    """The ring's layout is fixed (slices or not), so a seeded run draws the same replayed
    samples from it as before: sample i of the stream lies in slot i % capacity."""
    rng = np.random.default_rng(4)
    buffer = ReplayBuffer(50, "window", seed=3)
    start = 0
    for n in [49, 2, 120, 50, *rng.integers(1, 80, 60).tolist()]:
        buffer.add(*_batch(start, n))
        start += n
        slots = buffer._x[:, 0, 0].astype(np.int64) if start >= 50 else None
        if slots is not None:
            ids = np.arange(start - 50, start)
            np.testing.assert_array_equal(slots[ids % 50], ids)


def test_sample_is_without_replacement() -> None:
    buffer = ReplayBuffer(500, "reservoir", seed=4)
    _feed(buffer, [300, 700])
    for k in [0, 1, 250, 499, 500]:
        ids = buffer.sample(k)[0][:, 0, 0]
        assert len(ids) == k
        assert len(np.unique(ids)) == k
    with pytest.raises(ValueError, match="cannot sample 501"):
        buffer.sample(501)


@pytest.mark.parametrize(
    ("share", "n", "expected"),
    [(0.5, 64, 64), (0.2, 64, 16), (0.25, 30, 10), (0.75, 10, 30), (0.1, 5, 1), (0.0, 64, 0)],
)
def test_mix_replays_the_configured_share(share: float, n: int, expected: int) -> None:
    buffer = ReplayBuffer(1000, "reservoir", seed=5)
    _feed(buffer, [1000])
    x, y, w = _batch(5000, n)
    mx, my, mw, replayed = mix(x, y, w, buffer, share)
    assert replayed == expected == replay_count(n, share, len(buffer))
    assert len(mx) == len(my) == len(mw) == n + expected
    if expected:
        assert replayed / len(mx) == pytest.approx(share, abs=0.5 / len(mx))
    np.testing.assert_array_equal(mx[:n], x)  # the new samples come first, unchanged
    np.testing.assert_array_equal(mw[:n], w)
    old = mx[n:, 0, 0]
    assert (old < 1000).all() and len(np.unique(old)) == expected
    assert (my[n:, 0] == old).all() and (mw[n:] == old).all()
    assert mx.dtype == x.dtype and my.dtype == y.dtype and mw.dtype == w.dtype


def test_mix_is_bounded_by_what_the_buffer_holds_and_never_replays_the_batch() -> None:
    buffer = ReplayBuffer(100, "window", seed=6)
    start = 0
    replayed_counts = []
    for n in [32, 32, 32, 32]:
        x, y, w = _batch(start, n)
        mx, _, _, replayed = mix(x, y, w, buffer, share=0.5)
        assert (mx[n:, 0, 0] < start).all()  # mixed before the batch is added
        buffer.add(x, y, w)
        replayed_counts.append(replayed)
        start += n
    assert replayed_counts == [0, 32, 32, 32]
    x, y, w = _batch(start, 300)
    assert mix(x, y, w, buffer, share=0.5)[3] == 100


def test_bad_arguments_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)
    with pytest.raises(ValueError, match="mode"):
        ReplayBuffer(10, cast(Any, "fifo"))
    buffer = ReplayBuffer(10)
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(0)
    buffer.add(*_batch(0, 4))
    x, y, _ = _batch(0, 4)
    with pytest.raises(ValueError, match="shapes"):
        buffer.add(x[:, :1], y, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="batch size"):
        buffer.add(x, y, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="share"):
        mix(x, y, np.ones(4, np.float32), buffer, share=1.0)
