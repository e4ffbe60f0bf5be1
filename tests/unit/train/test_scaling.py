"""RunningStandardizer: batch merges equal a two-pass mean and variance over everything seen."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load, save

from livefit.server.train.scaling import (
    ROBUST_COUNT,
    SHIFT_RUN,
    SHIFT_WINDOW,
    SMALL_COUNT,
    LevelShift,
    LevelShiftWatch,
    RunningStandardizer,
)


def _random_batches(
    rng: np.random.Generator, count: int, shape: tuple[int, ...]
) -> list[np.ndarray]:
    sizes = [1, 1, 2, *rng.integers(1, 200, size=count - 3).tolist()]
    return [
        rng.normal(3.0, 2.0, size=(n, *shape)) * rng.uniform(0.5, 5.0, size=shape) for n in sizes
    ]


def test_matches_numpy_over_many_batches_of_varying_sizes() -> None:
    rng = np.random.default_rng(0)
    batches = _random_batches(rng, 300, (3, 2))
    scaler = RunningStandardizer()
    for batch in batches:
        scaler.update(batch)
    everything = np.concatenate(batches)
    assert scaler.count == len(everything)
    assert scaler.mean.shape == (3, 2)
    np.testing.assert_allclose(scaler.mean, everything.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(scaler.variance, everything.var(axis=0), rtol=1e-10)


@settings(max_examples=40, deadline=None, database=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=30))
def test_any_split_of_a_stream_gives_the_same_statistics(sizes: list[int]) -> None:
    rng = np.random.default_rng(len(sizes))
    data = rng.normal(-2.0, 0.3, size=(sum(sizes) + 1, 4))
    scaler = RunningStandardizer()
    for chunk in np.split(data, np.cumsum(sizes)):
        scaler.update(chunk)
    np.testing.assert_allclose(scaler.mean, data.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(scaler.variance, data.var(axis=0), rtol=1e-9)


def test_stable_with_a_large_offset_and_a_small_spread() -> None:
    rng = np.random.default_rng(1)
    batches = [1e9 + rng.normal(0.0, 0.5, size=(int(n), 2)) for n in rng.integers(1, 100, 400)]
    scaler = RunningStandardizer()
    for batch in batches:
        scaler.update(batch)
    everything = np.concatenate(batches)
    mean = everything.mean(axis=0)
    two_pass_var = np.square(everything - mean).mean(axis=0)
    # Subtracting 1e9 is exact here, so this two-pass variance is exact to ~1e-16.
    exact_var = (everything - 1e9).var(axis=0)
    # The one-pass textbook formula is useless here, so this test can tell stable from naive.
    naive_var = np.square(everything).mean(axis=0) - np.square(mean)
    assert np.abs(naive_var - exact_var).max() > 1.0
    np.testing.assert_allclose(scaler.mean, mean, rtol=1e-14)
    np.testing.assert_allclose(scaler.variance, two_pass_var, rtol=1e-9)
    np.testing.assert_allclose(scaler.variance, exact_var, rtol=1e-13)


def test_transform_standardises_and_leaves_constant_features_unscaled() -> None:
    rng = np.random.default_rng(2)
    x = np.column_stack([rng.normal(5.0, 3.0, 1000), np.full(1000, 7.25), np.full(1000, 1e9 + 0.1)])
    scaler = RunningStandardizer()
    for chunk in np.array_split(x, 13):
        scaler.update(chunk)
    out = scaler.transform(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[:, 0].mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(out[:, 0].std(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(out[:, 1:], 0.0, atol=1e-6)
    shifted = scaler.transform(np.array([[5.0, 8.25, 1e9 + 2.1]]))[0, 1:]
    np.testing.assert_allclose(shifted, [1.0, 2.0], rtol=1e-6)
    _, std = scaler.mean_std()
    assert std[1:].tolist() == [1.0, 1.0]


def test_identity_before_any_update() -> None:
    scaler = RunningStandardizer()
    x = np.arange(6.0).reshape(2, 3)
    out = scaler.transform(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x)
    mean, std = scaler.mean_std()
    np.testing.assert_array_equal((x - mean) / std, x)
    scaler.update(np.empty((0, 3)))
    assert scaler.count == 0


def test_mean_std_reproduce_the_transform_for_a_serving_model() -> None:
    rng = np.random.default_rng(3)
    scaler = RunningStandardizer()
    scaler.update(rng.normal(10.0, 4.0, size=(500, 2, 3)).astype(np.float32))
    mean, std = scaler.mean_std()
    assert mean.dtype == std.dtype == np.float32
    assert mean.shape == std.shape == (2, 3)
    x = rng.normal(10.0, 4.0, size=(20, 2, 3)).astype(np.float32)
    np.testing.assert_allclose((x - mean) / std, scaler.transform(x), rtol=1e-5, atol=1e-6)


def test_state_round_trips_through_safetensors_and_goes_on_alike() -> None:
    rng = np.random.default_rng(4)
    scaler = RunningStandardizer(per_last_axis=True)
    scaler.update(rng.normal(size=(50, 7, 3)))
    state = scaler.state()
    assert all(isinstance(value, np.ndarray) for value in state.values())
    restored = RunningStandardizer.from_state(load(save(state)))
    more = rng.normal(size=(30, 7, 3))
    np.testing.assert_array_equal(restored.transform(more), scaler.transform(more))
    scaler.update(more)
    restored.update(more)
    for key, value in scaler.state().items():
        np.testing.assert_allclose(restored.state()[key], value, rtol=1e-13)


def test_state_of_a_fresh_standardizer_round_trips() -> None:
    restored = RunningStandardizer.from_state(RunningStandardizer().state())
    assert restored.count == 0
    np.testing.assert_array_equal(restored.transform(np.ones((1, 2))), np.ones((1, 2)))


def test_sequence_inputs_pool_each_feature_over_time() -> None:
    rng = np.random.default_rng(5)
    scales = np.array([1.0, 10.0, 100.0])
    batches = [rng.normal(size=(int(n), 12, 3)) * scales + scales for n in rng.integers(1, 40, 50)]
    pooled, per_step = RunningStandardizer(per_last_axis=True), RunningStandardizer()
    for batch in batches:
        pooled.update(batch)
        per_step.update(batch)
    everything = np.concatenate(batches)
    assert pooled.count == everything.shape[0] * everything.shape[1]
    np.testing.assert_allclose(pooled.mean, everything.mean(axis=(0, 1)), rtol=1e-10)
    np.testing.assert_allclose(pooled.variance, everything.var(axis=(0, 1)), rtol=1e-10)
    assert per_step.state()["mean"].shape == (12, 3)
    mean, std = pooled.mean_std()
    assert mean.shape == std.shape == (3,)
    out = pooled.transform(everything)
    np.testing.assert_allclose(out.reshape(-1, 3).std(axis=0), 1.0, rtol=1e-5)


def test_a_batch_of_another_shape_is_refused_with_both_shapes() -> None:
    scaler = RunningStandardizer()
    scaler.update(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(4,\).*\(3,\)"):
        scaler.update(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="axes"):
        scaler.update(np.zeros(3))


def test_few_values_are_scaled_by_an_upper_confidence_bound() -> None:
    """Two values close together say little about the spread: divided by their own standard
    deviation (0.005 here) the next input would come out at 200; the 95 % upper bound keeps it
    near 1. The plain statistics stay exact."""
    scaler = RunningStandardizer()
    scaler.update(np.array([[0.0], [0.01]]))
    _, std = scaler.mean_std()
    assert std[0] == pytest.approx(np.sqrt(0.01**2 / 2 / 0.0039321), rel=1e-4)
    assert abs(scaler.transform(np.array([[1.0]]))[0, 0]) < 10
    assert scaler.variance[0] == pytest.approx(0.005**2)
    x = np.random.default_rng(6).normal(3.0, 2.0, size=(8, 1))
    scaler.update(x)  # 10 values: the plain standard deviation from here on
    everything = np.concatenate([[[0.0], [0.01]], x])
    np.testing.assert_allclose(scaler.mean_std()[1], everything.std(axis=0), rtol=1e-6)


def test_a_first_batch_of_two_samples_does_not_stall_learning() -> None:
    """A stream whose first minibatch held two samples (single-sample messages taken as they
    come), then full ones: with the two samples' own standard deviation the next batch's inputs
    came out tens of times too large, and their gradients held Nadam's second moments up for
    the rest of a 5,000-sample stream (loss 8.6 at the end, 12 at sample 500)."""
    from livefit.server.base.metrics import Metrics
    from livefit.server.config.model import ModelSettings
    from livefit.server.ingest.sample_queue import SampleQueue
    from livefit.server.train.trainer import Trainer
    from livefit.server.wire.samples import Batch
    from livefit.server.wire.snapshot import SnapshotSlot

    settings = ModelSettings.model_validate(
        {"builder": "linear", "input_shape": [8], "output_shape": [1], "learning_rate": 0.05,
         "seed": 1, "train": {"max_batch_size": 128}}
    )  # fmt: skip
    t = Trainer("m", settings, SampleQueue(10_000), SnapshotSlot(), Metrics(), "/CPU:0")
    t.warm_up()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(5000, 8))
    y = x @ np.linspace(-1.0, 1.0, 8).reshape(8, 1) + 0.5 + rng.normal(scale=0.01, size=(5000, 1))
    start, early = 0, None
    for size in [2] + [128] * 40:
        n = min(size, 500 - start) if start < 500 else size
        xb, yb = x[start : start + n], y[start : start + n]
        t.train_batch(Batch(xb.astype(np.float32), yb.astype(np.float32),
                            np.ones(len(xb), np.float32), 1, None, None, backlog=1))  # fmt: skip
        start += n
        if start == 500:
            early = t.scores.scores["loss"].value
    assert early is not None
    assert t.scores.scores["loss"].value * 10 <= early


def test_outlier_bounds_need_enough_values_and_are_wider_at_first() -> None:
    rng = np.random.default_rng(0)
    s = RunningStandardizer()
    s.update(rng.normal(2.0, 0.5, size=(SMALL_COUNT - 1, 1)))
    assert s.bounds(8.0) is None  # too few values for a standard deviation to bound anything
    assert not s.clip_outliers(np.array([[1e9]]), 8.0)[1].any()
    for count, widen in ((SMALL_COUNT, ROBUST_COUNT / SMALL_COUNT), (50, 2.0), (ROBUST_COUNT, 1.0),
                         (1000, 1.0)):  # fmt: skip
        s.update(rng.normal(2.0, 0.5, size=(count - s.count, 1)))
        bounds = s.bounds(8.0)
        assert bounds is not None
        mean, std = s.mean_std()
        np.testing.assert_allclose(bounds[0], mean - 8 * widen * std, rtol=1e-6)
        np.testing.assert_allclose(bounds[1], mean + 8 * widen * std, rtol=1e-6)
    assert s.bounds(0.0) is None


def test_clip_outliers_sets_values_beyond_the_bounds_to_them_and_counts_rows() -> None:
    rng = np.random.default_rng(1)
    s = RunningStandardizer()
    s.update(rng.normal(0.0, 1.0, size=(1000, 3)))
    bounds = s.bounds(8.0)
    assert bounds is not None
    low, high = bounds
    x = rng.normal(0.0, 1.0, size=(5, 3)).astype(np.float32)
    x[1, 2], x[3, 0], x[3, 1] = 3e38, -1e9, 50.0
    clipped, rows = s.clip_outliers(x, 8.0)
    assert rows.tolist() == [False, True, False, True, False] and clipped.dtype == np.float32
    np.testing.assert_allclose(clipped[1, 2], high[2], rtol=1e-6)
    np.testing.assert_allclose(clipped[3, :2], [low[0], high[1]], rtol=1e-6)
    untouched = np.ones(x.shape, bool)
    untouched[1, 2] = untouched[3, 0] = untouched[3, 1] = False
    np.testing.assert_array_equal(clipped[untouched], x[untouched])
    same, none = s.clip_outliers(x[[0, 2, 4]], 8.0)
    assert not none.any()
    np.testing.assert_array_equal(same, x[[0, 2, 4]])


@pytest.mark.parametrize("outlier", [3e38, 1e9, -1e9])
def test_one_clipped_outlier_moves_the_statistics_by_a_bounded_amount(outlier: float) -> None:
    s = RunningStandardizer()
    s.update(np.random.default_rng(2).normal(2.0, 0.5, size=(2000, 1)))
    mean, variance, n = s.mean, s.variance, s.count
    assert mean is not None and variance is not None
    clipped, rows = s.clip_outliers(np.array([[outlier]], np.float32), 8.0)
    s.update(clipped)
    assert rows.tolist() == [True]
    assert s.mean is not None and s.variance is not None
    # the mean moves by at most k * std / n, the variance grows by about k**2 / n of itself
    assert abs(s.mean - mean)[0] <= 8 * np.sqrt(variance[0]) / (n + 1) * 1.01
    assert s.variance[0] <= variance[0] * (1 + 8**2 / n) * 1.01


@pytest.mark.parametrize(("shift", "samples"), [(100.0, 250), (1e4, 700)])
def test_a_real_level_shift_is_followed_through_the_clipping(shift: float, samples: int) -> None:
    """Clipped values still widen the statistics, each by about k**2 / n: a new level 100
    (10,000) standard deviations away stops being clipped after 250 (700) samples."""
    rng = np.random.default_rng(3)
    s = RunningStandardizer()
    s.update(rng.normal(size=(2000, 1)))
    for _ in range(samples // 25):
        clipped, _ = s.clip_outliers(rng.normal(shift, 1.0, size=(25, 1)), 8.0)
        s.update(clipped)
    assert not s.clip_outliers(rng.normal(shift, 1.0, size=(1000, 1)), 8.0)[1].any()


def _watch_after(values: np.ndarray, bounds: tuple[float, float]) -> LevelShift | None:
    watch = LevelShiftWatch()
    low, high = np.array([bounds[0]]), np.array([bounds[1]])
    shift = None
    for value in values:
        shift = watch.observe(np.array([[value]]), (low, high)) or shift
    return shift


def test_a_run_beyond_the_bound_on_one_side_is_a_level_shift_with_robust_statistics() -> None:
    rng = np.random.default_rng(4)
    inside = rng.uniform(-1.0, 1.0, size=12)
    new_level = 1000.0 + rng.normal(0.0, 0.5, size=SHIFT_RUN)
    new_level[3] = 3e38  # an outlier inside the run moves neither the median nor the spread
    shift = _watch_after(np.concatenate([inside, new_level]), (-5.0, 5.0))
    assert shift is not None and shift.count == SHIFT_RUN
    assert shift.features.tolist() == [0] and shift.side.tolist() == [1]
    assert abs(shift.mean[0] - 1000.0) < 0.5 and 0.1 < np.sqrt(shift.variance[0]) < 1.5
    # one short of the run, scattered outliers, both sides, non-finite values: no shift
    assert _watch_after(np.concatenate([inside, new_level[1:]]), (-5.0, 5.0)) is None
    scattered = np.where(np.arange(64) % 3 == 0, 1e9, 0.0)  # 22 of 64, at most 11 of 32
    assert _watch_after(scattered, (-5.0, 5.0)) is None
    both = np.tile([1e9, -1e9], 16)
    assert _watch_after(both, (-5.0, 5.0)) is None
    assert _watch_after(np.full(SHIFT_WINDOW, np.inf), (-5.0, 5.0)) is None
    assert _watch_after(np.full(SHIFT_WINDOW, np.nan), (-5.0, 5.0)) is None


def _reference_shift(
    kept: list[tuple[np.ndarray, np.ndarray]], y: np.ndarray, low: np.ndarray, high: np.ndarray
) -> LevelShift | None:
    """The level-shift rule one target at a time: the last SHIFT_WINDOW targets (``kept``, as
    (values, sides) rows) judged after each batch; a run of SHIFT_RUN on one side is a shift,
    whose statistics are the median and interquartile range of that side's values."""
    for row in y.reshape(len(y), -1).astype(np.float64):
        side = np.where(np.isfinite(row) & (row > high), 1, 0)
        side = np.where(np.isfinite(row) & (row < low), -1, side)
        kept.append((row, side))
        del kept[:-SHIFT_WINDOW]
    if not kept:
        return None
    values, sides = np.array([v for v, _ in kept]), np.array([s for _, s in kept])
    above, below = (sides == 1).sum(axis=0), (sides == -1).sum(axis=0)
    features = np.flatnonzero((above >= SHIFT_RUN) | (below >= SHIFT_RUN))
    if features.size == 0:
        return None
    side = np.where(above[features] >= SHIFT_RUN, 1, -1)
    picked = [values[sides[:, f] == s, f] for f, s in zip(features, side, strict=True)]
    quartiles = [np.percentile(v, [25, 50, 75]) for v in picked]
    kept.clear()
    return LevelShift(
        features,
        side,
        np.array([q[1] for q in quartiles]),
        np.array([((q[2] - q[0]) / 1.3489795) ** 2 for q in quartiles]),
        min(len(v) for v in picked),
    )


def test_the_watch_agrees_with_the_rule_one_target_at_a_time() -> None:
    """Whatever the mix (quiet stretches, lone outliers, runs on either side, inf and NaN,
    batches of 1 to 300 rows, two features), the watch finds the shifts the rule finds, with
    the same statistics; also while it keeps nothing between batches with no target beyond
    the bound."""
    rng = np.random.default_rng(11)
    low, high = np.array([-5.0, -5.0]), np.array([5.0, 5.0])
    watch, kept, shifts = LevelShiftWatch(), [], 0
    for _ in range(600):
        n = int(rng.choice([1, 3, 25, 300]))
        y = rng.normal(0.0, 1.0, size=(n, 2))
        mode = rng.integers(0, 6)
        if mode == 1:  # lone outliers
            y[rng.integers(0, n, size=max(1, n // 10)), rng.integers(0, 2)] = 1e6
        elif mode == 2:  # a new level on one feature, above or below
            y[:, rng.integers(0, 2)] += rng.choice([-40.0, 40.0])
        elif mode == 3:  # non-finite targets
            y[rng.integers(0, n)] = rng.choice([np.inf, -np.inf, np.nan])
        expected = _reference_shift(kept, y, low, high)
        found = watch.observe(y, (low, high))
        assert (found is None) == (expected is None)
        if found is not None and expected is not None:
            shifts += 1
            assert found.features.tolist() == expected.features.tolist()
            assert found.side.tolist() == expected.side.tolist() and found.count == expected.count
            np.testing.assert_allclose(found.mean, expected.mean)
            np.testing.assert_allclose(found.variance, expected.variance)
    assert shifts > 20  # the mix did exercise shifts


def test_a_shift_re_centres_only_its_features_and_restarts_the_count() -> None:
    rng = np.random.default_rng(5)
    s = RunningStandardizer()
    s.update(rng.normal([2.0, -3.0], [0.1, 2.0], size=(2000, 2)))
    before_mean, before_var = s.mean, s.variance
    assert before_mean is not None and before_var is not None
    bounds = s.bounds(8.0)
    assert bounds is not None
    watch = LevelShiftWatch()
    y = np.column_stack([rng.normal(-50.0, 0.2, 25), rng.normal(-3.0, 2.0, 25)])
    shift = watch.observe(y, bounds)
    assert shift is not None and shift.features.tolist() == [0] and shift.side.tolist() == [-1]
    moved = s.recentred(shift)
    assert moved.count == 25 and moved.mean is not None and moved.variance is not None
    assert abs(moved.mean[0] + 50.0) < 0.2 and moved.mean[1] == before_mean[1]
    np.testing.assert_allclose(moved.variance[1], before_var[1])
    assert not moved.clip_outliers(y, 8.0)[1].any()  # the new level is inside the new bound
    # the window starts again after a shift: the run's targets do not count twice
    assert watch.observe(y[: SHIFT_RUN - 1], bounds) is None


def test_outlier_bounds_follow_every_update_and_copy() -> None:
    """The bounds are memoised per statistics: an update (or a different k) recomputes them,
    and a copy taken before an update keeps the old ones."""
    rng = np.random.default_rng(3)
    scaler = RunningStandardizer()
    scaler.update(rng.normal(0.0, 1.0, (200, 2)))
    first = scaler.bounds(8.0)
    saved = scaler.copy()
    scaler.update(rng.normal(50.0, 1.0, (200, 2)))
    assert first is not None and saved.bounds(8.0) is not None
    np.testing.assert_array_equal(saved.bounds(8.0)[1], first[1])
    fresh = RunningStandardizer.from_state(scaler.state())
    for k in (8.0, 3.0):
        expected, got = fresh.bounds(k), scaler.bounds(k)
        assert expected is not None and got is not None
        np.testing.assert_allclose(got[0], expected[0])
        np.testing.assert_allclose(got[1], expected[1])
    assert not np.allclose(scaler.bounds(8.0)[1], first[1])  # type: ignore[index]


@pytest.mark.parametrize("n", [1, SHIFT_WINDOW - 1, SHIFT_WINDOW, 5 * SHIFT_WINDOW + 3])
def test_level_shift_watch_gives_the_same_shifts_whatever_the_batch_split(n: int) -> None:
    """Only the newest window of targets is judged: batches of any size find the shift at
    the same sample as one sample at a time."""
    rng = np.random.default_rng(4)
    stream = np.concatenate([rng.normal(0, 1, 300), rng.normal(100, 1, 300)]).reshape(-1, 1)
    bounds = (np.array([-8.0]), np.array([8.0]))

    def first_shift(size: int) -> int | None:
        watch = LevelShiftWatch()
        for start in range(0, len(stream), size):
            if watch.observe(stream[start : start + size], bounds) is not None:
                return start + size
        return None

    one_by_one = first_shift(1)
    assert one_by_one == 300 + SHIFT_RUN
    found = first_shift(n)
    assert found is not None and found - n < one_by_one <= found
