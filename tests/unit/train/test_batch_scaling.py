"""``BatchScaling`` on a real model with input and target scaling: statistics include a batch
only for the step after it, a rolled-back batch takes them back, an outlying target is
clipped and weighted 0, and the statistics survive a checkpoint's extra arrays."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.models.builders import build_model
from livefit.server.train.batch_scaling import BatchScaling
from livefit.server.wire.samples import Batch


def scaling() -> BatchScaling:
    model = build_model("linear", [2], [1], scaling="standardize", target_scaling="standardize")
    return BatchScaling(model, per_last_axis=False, target_outlier_std=8.0)


def batch(x: np.ndarray, y: np.ndarray) -> Batch:
    w = np.ones(len(x), dtype=np.float32)
    return Batch(x.astype(np.float32), y.astype(np.float32), w, 1, None, None)


def test_the_next_statistics_include_the_batch() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(3.0, 2.0, size=(500, 2)), rng.normal(-5.0, 0.5, size=(500, 1))
    s = scaling()
    stats = s.next_statistics(batch(x, y))
    targets = s.next_target_statistics(batch(x, y))
    assert stats is not None and targets is not None
    np.testing.assert_allclose(stats[0].reshape(-1), x.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(stats[1].reshape(-1), x.std(axis=0), rtol=1e-3)
    np.testing.assert_allclose(targets[0].reshape(-1), y.mean(), rtol=1e-4)


def test_a_rolled_back_batch_takes_its_statistics_back() -> None:
    rng = np.random.default_rng(2)
    s = scaling()
    first = batch(rng.normal(size=(50, 2)), rng.normal(size=(50, 1)))
    s.next_statistics(first)
    s.next_target_statistics(first)
    before = s.state()
    wild = batch(rng.normal(100.0, 1.0, size=(50, 2)), rng.normal(100.0, 1.0, size=(50, 1)))
    s.next_statistics(wild)
    s.next_target_statistics(wild)
    s.roll_back()
    after = s.state()
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])


def test_an_outlying_target_is_clipped_and_weighted_zero() -> None:
    rng = np.random.default_rng(3)
    s = scaling()
    good = batch(rng.normal(size=(400, 2)), rng.normal(size=(400, 1)))
    s.next_target_statistics(good)
    y = rng.normal(size=(10, 1))
    y[4] = 1e9
    clipped, outliers = s.clip_target_outliers(batch(rng.normal(size=(10, 2)), y))
    assert outliers == 1
    assert clipped.w[4] == 0 and np.all(np.delete(clipped.w, 4) == 1)
    assert 0 < clipped.y[4, 0] < 20  # at the bound, 8 standard deviations out
    untouched, none = s.clip_target_outliers(good)
    assert none == 0 and untouched is good


def test_the_statistics_survive_a_checkpoint() -> None:
    rng = np.random.default_rng(4)
    s = scaling()
    b = batch(rng.normal(2.0, 3.0, size=(200, 2)), rng.normal(7.0, 1.0, size=(200, 1)))
    s.next_statistics(b)
    s.next_target_statistics(b)
    restored = scaling()
    restored.restore(s.state())
    assert restored.scaler is not None and s.scaler is not None
    for mine, theirs in zip(restored.scaler.mean_std(), s.scaler.mean_std(), strict=True):
        np.testing.assert_allclose(mine, theirs)
    assert restored.target_scaler is not None and s.target_scaler is not None
    assert restored.target_scaler.mean_std()[0] == pytest.approx(s.target_scaler.mean_std()[0])
