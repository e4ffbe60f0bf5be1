"""DriftDetector on synthetic per-sample loss streams, with fixed seeds.

The bounds below are the figures measured with the defaults (see server/train/drift.py), with some
room: a change of the defaults that makes detection slower or noisier fails here.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
from river.drift import PageHinkley as RiverPageHinkley

from livefit.server.train.drift import DriftDetector, DriftMethod, PageHinkley

SEEDS = range(10)


def _feed(detector: DriftDetector, losses: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Feed ``losses`` in random minibatches (1-256); the stream positions of detections."""
    found = []
    start = 0
    while start < len(losses):
        n = int(rng.integers(1, 257))
        if detector.update(losses[start : start + n]):
            assert detector.last_detection_at is not None
            found.append(detector.last_detection_at)
        start += n
    return found


def _stationary(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    if kind == "half-normal":
        return np.abs(rng.normal(0.1, 0.05, n))
    if kind == "log-normal":  # heavy-tailed, like the losses of a classifier
        return rng.lognormal(-2.0, 1.0, n)
    return rng.exponential(0.3, n)


def _abrupt(rng: np.random.Generator) -> np.ndarray:
    return np.abs(np.concatenate([rng.normal(0.1, 0.05, 5000), rng.normal(1.0, 0.2, 5000)]))


@pytest.mark.parametrize("kind", ["half-normal", "log-normal", "exponential"])
def test_no_false_alarm_on_long_stationary_streams(kind: str) -> None:
    # Measured: 0 false alarms in 10 x 50,000 samples of each kind (and 0 in 5 million per kind).
    alarms = 0
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        detector = DriftDetector()
        _feed(detector, _stationary(rng, kind, 50_000), rng)
        alarms += detector.detections
    assert alarms == 0


def test_an_abrupt_rise_of_the_loss_is_found_within_25_samples() -> None:
    # Measured: 9-10 samples after the change for these seeds.
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        detector = DriftDetector()
        found = _feed(detector, _abrupt(rng), rng)
        assert found, f"seed {seed}: no drift found"
        assert 5000 <= found[0] < 5000 + 25, (seed, found)
        assert detector.detections == len(found) == 1


def test_a_rise_of_one_standard_deviation_is_found_within_150_samples() -> None:
    # Measured: 47-69 samples after the change (0.10 -> 0.15 with a spread of 0.05).
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        losses = np.abs(np.concatenate([rng.normal(0.1, 0.05, 5000), rng.normal(0.15, 0.05, 5000)]))
        found = _feed(DriftDetector(), losses, rng)
        assert found and 5000 <= found[0] < 5150, (seed, found)


def test_a_gradual_rise_is_found_eventually() -> None:
    # The mean ramps from 0.1 to 1.0 over 20,000 samples; measured: 496-612 samples in.
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        ramp = np.linspace(0.0, 1.0, 20_000)
        losses = np.abs(
            np.concatenate(
                [rng.normal(0.1, 0.05, 5000), rng.normal(0.1 + 0.9 * ramp, 0.05 + 0.15 * ramp)]
            )
        )
        found = _feed(DriftDetector(), losses, rng)
        assert found and 5000 <= found[0] < 5000 + 1500, (seed, found)


def test_a_falling_loss_is_not_drift_unless_asked() -> None:
    rng = np.random.default_rng(0)
    losses = np.abs(np.concatenate([rng.normal(1.0, 0.2, 5000), rng.normal(0.1, 0.05, 5000)]))
    assert _feed(DriftDetector(), losses, rng) == []
    assert _feed(DriftDetector(mode="down"), losses, rng)[0] in range(5000, 5025)
    assert _feed(DriftDetector(mode="both"), losses, rng)[0] in range(5000, 5025)


def test_detections_do_not_depend_on_the_loss_scale_or_on_the_batching() -> None:
    rng = np.random.default_rng(1)
    losses = np.abs(np.concatenate([rng.normal(0.1, 0.05, 3000), rng.normal(0.3, 0.1, 3000)]))
    one_batch = DriftDetector()
    one_batch.update(losses)
    scaled = DriftDetector()
    scaled.update(losses * 1000.0)
    assert one_batch.last_detection_at == scaled.last_detection_at
    assert _feed(DriftDetector(), losses, rng) == [one_batch.last_detection_at]


def test_several_drifts_in_one_batch_are_all_counted_and_the_test_restarts() -> None:
    rng = np.random.default_rng(2)
    levels = [0.1, 1.0, 5.0, 20.0]
    losses = np.concatenate([np.abs(rng.normal(level, level / 5, 2000)) for level in levels])
    detector = DriftDetector()
    assert detector.update(losses)
    assert detector.detections == 3
    assert detector.last_detection_at is not None and 6000 <= detector.last_detection_at < 6025
    assert not detector.update(np.abs(rng.normal(20.0, 4.0, 2000)))


@pytest.mark.parametrize("alpha", [1 - 1e-4, 0.99])
def test_page_hinkley_in_loss_units_matches_river(alpha: float) -> None:
    # River's PageHinkley one value at a time; ours on uneven batches, closed-form sums.
    rng = np.random.default_rng(3)
    parts = [
        (0.1, 0.05, 3000),
        (1.0, 0.2, 500),
        (0.3, 0.1, 3000),
        (3.0, 1.0, 300),
        (0.5, 0.2, 2000),
    ]
    losses = np.abs(np.concatenate([rng.normal(m, s, n) for m, s, n in parts]))
    params = {"delta": 0.005, "threshold": 50.0 if alpha > 0.999 else 5.0, "alpha": alpha}
    river = RiverPageHinkley(mode="up", **params)  # type: ignore[arg-type]
    expected = []
    for i, value in enumerate(losses.tolist()):
        river.update(value)
        if river.drift_detected:
            expected.append(i)
    ours = PageHinkley(mode="up", standardize=False, clip=None, **params)
    found, start = [], 0
    for chunk in np.array_split(losses, 37):
        found += [start + i for i in ours.update(chunk)]
        start += len(chunk)
    assert len(expected) >= 2
    assert found == expected


@pytest.mark.parametrize("method", ["page_hinkley", "adwin"])
def test_reset_forgets_the_stream_so_far(method: DriftMethod) -> None:
    rng = np.random.default_rng(4)
    detector = DriftDetector(method)
    detector.update(np.abs(rng.normal(0.1, 0.05, 3000)))
    detector.reset()
    # After a reset the new level is the baseline, not a rise.
    assert not detector.update(np.abs(rng.normal(1.0, 0.2, 3000)))
    assert detector.samples_seen == 6000 and detector.detections == 0


def test_non_finite_losses_are_skipped() -> None:
    detector = DriftDetector()
    assert not detector.update(np.array([0.1, np.nan, np.inf, 0.2]))
    assert detector.samples_seen == 2


def test_adwin_from_river_finds_the_abrupt_rise_and_stays_quiet_when_stationary() -> None:
    # Measured: found 23 samples after the change for every seed (ADWIN checks every 32).
    for seed in range(3):
        rng = np.random.default_rng(seed)
        detector = DriftDetector("adwin")
        assert _feed(detector, _stationary(rng, "half-normal", 20_000), rng) == []
        detector = DriftDetector("adwin")
        found = _feed(detector, _abrupt(rng), rng)
        assert found and 5000 <= found[0] < 5000 + 64, (seed, found)


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="page_hinkley"):
        DriftDetector(cast(Any, "cusum"))
    with pytest.raises(ValueError, match="alpha"):
        DriftDetector(alpha=0.0)


def _plain_run(ph: PageHinkley, state: dict[str, float], x: np.ndarray) -> int | None:
    """The test written out plainly (the implementation before it was rewritten in place, for
    fewer numpy calls): a new array for every step. Same arguments as ``PageHinkley._run``, the
    state as a dict (updated where no drift is found)."""
    t = np.arange(1, len(x) + 1, dtype=np.float64)
    count = state["n"] + t
    pivot = state["mean"] if state["n"] else float(x[0])
    centred = x - pivot
    s1 = np.cumsum(centred)
    mean = pivot + s1 / count
    dev = x - mean
    m2 = state["m2"] + np.cumsum(centred * centred) - s1 * s1 / count
    if ph.standardize:
        std = np.sqrt(np.maximum(m2, 0.0) / count)
        dev = np.divide(dev, std, out=np.zeros_like(dev), where=std > 0)
        if ph.clip is not None:
            dev = np.minimum(np.maximum(dev, -ph.clip), ph.clip)

    def fading(start: float, steps: np.ndarray) -> np.ndarray:
        if ph.alpha == 1.0:
            return start + np.cumsum(steps)
        power = ph.alpha ** np.arange(1, len(steps) + 1, dtype=np.float64)
        return power * (start + np.cumsum(steps / power))

    new = {**state, "n": state["n"] + len(x), "mean": float(mean[-1]), "m2": float(m2[-1])}
    alarm = np.zeros(len(x), dtype=bool)
    if ph.mode in ("up", "both"):
        up = fading(state["sum_up"], dev - ph.delta)
        low = np.minimum.accumulate(np.minimum(up, state["min_up"]))
        alarm |= up - low > ph.threshold
        new["sum_up"], new["min_up"] = float(up[-1]), float(low[-1])
    if ph.mode in ("down", "both"):
        down = fading(state["sum_down"], dev + ph.delta)
        high = np.maximum.accumulate(np.maximum(down, state["max_down"]))
        alarm |= high - down > ph.threshold
        new["sum_down"], new["max_down"] = float(down[-1]), float(high[-1])
    alarm &= count >= ph.min_instances
    if alarm.any():
        return int(np.argmax(alarm))
    state.update(new)
    return None


def _plain_update(ph: PageHinkley, state: dict[str, float], values: np.ndarray) -> list[int]:
    """``PageHinkley.update`` over ``_plain_run``."""
    fresh = {"n": 0, "mean": 0.0, "m2": 0.0, "sum_up": 0.0, "min_up": np.inf,
             "sum_down": 0.0, "max_down": -np.inf}  # fmt: skip
    if not state:
        state.update(fresh)
    found, start = [], 0
    while start < len(values):
        chunk = values[start : start + ph._chunk]
        hit = _plain_run(ph, state, chunk)
        if hit is None:
            start += len(chunk)
        else:
            found.append(start + hit)
            state.clear()
            state.update(fresh)
            start += hit + 1
    return found


def test_page_hinkley_finds_what_the_plain_formulas_find_to_the_bit() -> None:
    """Every mode, with and without standardizing and clipping, fading or not, batches of 1 to
    3,000 values with level jumps and constant runs (a zero spread): the same detections and
    the same state, float for float, as the formulas written out plainly."""
    rng = np.random.default_rng(0)
    batches = detections = 0
    for _ in range(120):
        params = {
            "mode": str(rng.choice(["up", "down", "both"])),
            "standardize": bool(rng.integers(2)),
            "alpha": float(rng.choice([1.0, 1 - 1e-4, 0.99])),
            "clip": [None, 5.0, 2.0][int(rng.integers(3))],
            "min_instances": int(rng.choice([1, 30, 100])),
            "threshold": float(rng.choice([5.0, 50.0])),
            "delta": float(rng.choice([0.005, 0.2])),
        }
        ph, state = PageHinkley(**params), {}
        level = 0.1
        for _ in range(25):
            n = int(rng.choice([1, 2, 25, 256, 1024, 3000]))
            if rng.random() < 0.1:
                level *= float(rng.choice([0.2, 5.0]))
            values = np.abs(rng.normal(level, level / 2, n))
            if rng.random() < 0.05:
                values[:] = 1.0
            found = ph.update(values)
            assert found == _plain_update(ph, state, values), params
            s = ph._s
            ours = [s.n, s.mean, s.m2, s.sum_up, s.min_up, s.sum_down, s.max_down]
            plain = [state[k] for k in ("n", "mean", "m2", "sum_up", "min_up", "sum_down",
                                        "max_down")]  # fmt: skip
            assert ours == plain, params
            batches += 1
            detections += len(found)
    assert detections > 1000  # the streams make the test fire, often
