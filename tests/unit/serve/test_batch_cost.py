"""What a batch costs and how long to wait for one (``serve.batch_cost``): the cost model fitted
online, and the ``serve.batch_timeout_ms = "auto"`` controller on a synthetic clock (the batcher
with it: ``test_batcher.py``; a real ``livefit serve`` exporting the chosen value:
``tests/e2e/test_batch_timeout_serve.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.server.serve.batch_cost import ArrivalRate, AutoTimeout, BatchCost


def cost(per_row_s: float, per_batch_s: float) -> BatchCost:
    return BatchCost(per_row_s=per_row_s, per_batch_s=per_batch_s)


def stream(controller: AutoTimeout, rate: float, seconds: float, start: float = 0.0) -> float:
    """One row every 1/rate seconds for ``seconds`` on the synthetic clock; returns the end."""
    now, gap = start, 1.0 / rate
    while now < start + seconds:
        controller.arrived(1, now)
        now += gap
    return now


def test_arrival_rate_follows_a_steady_stream_and_fades_when_it_stops() -> None:
    rate = ArrivalRate(time_constant_s=0.1)
    now = 0.0
    for _ in range(2000):  # 2,000 rows/s for a second
        rate.add(1, now)
        now += 0.0005
    assert rate.rate(now) == pytest.approx(2000, rel=0.02)
    assert rate.rate(now + 1.0) < 1.0  # ten time constants later: all but gone
    assert ArrivalRate().rate(123.0) == 0.0


def test_zero_when_the_per_batch_cost_is_negligible() -> None:
    controller = AutoTimeout(cost(per_row_s=1e-4, per_batch_s=1e-6), bound_s=0.05)
    end = stream(controller, rate=10_000, seconds=0.5)
    assert controller.choose(end) == (0.0, 1.0)


def test_zero_when_the_cost_grows_with_rows_as_on_a_cpu_model() -> None:
    # rows come every 0.5 ms and a batch costs 0.3 ms + 0.1 ms a row: merging saves less than
    # the wait costs (lambda * (c0 - c1) = 0.4 < 2)
    controller = AutoTimeout(cost(per_row_s=1e-4, per_batch_s=3e-4), bound_s=0.05)
    end = stream(controller, rate=2000, seconds=0.5)
    assert controller.choose(end)[0] == 0.0


def test_waits_when_the_per_batch_cost_dominates_and_rows_come_often() -> None:
    # a GPU-like model: 5 ms a batch whatever its size, rows every 0.5 ms
    c0, c1, rate = 5e-3, 1e-5, 2000.0
    controller = AutoTimeout(cost(per_row_s=c1, per_batch_s=c0), bound_s=0.05)
    end = stream(controller, rate=rate, seconds=0.5)
    timeout, target = controller.choose(end)
    lam = controller.rate.rate(end)
    assert lam == pytest.approx(rate, rel=0.05)
    assert target == pytest.approx((lam * c0 - 1) / (1 + lam * c1))  # about 8.8 rows
    assert timeout == pytest.approx((target - 1) / lam)  # about 3.9 ms: the rest of them
    assert 0.0 < timeout < c0  # never longer than the fixed cost it saves
    assert controller.timeout_s == timeout  # what the gauge exports


def test_never_exceeds_the_bound() -> None:
    controller = AutoTimeout(cost(per_row_s=0.0, per_batch_s=10.0), bound_s=0.004)
    end = stream(controller, rate=5000, seconds=0.5)
    timeout, target = controller.choose(end)
    assert timeout == 0.004 and target > 1000
    assert AutoTimeout(cost(0.0, 10.0), bound_s=0.0).choose(end)[0] == 0.0


def test_zero_for_one_closed_loop_client() -> None:
    # one client sends its next request when the last is answered: the gap between rows is at
    # least a whole batch, c0 + c1, which is never short enough to be worth waiting for
    for c0 in (1e-4, 1e-3, 1e-2, 0.1):
        controller = AutoTimeout(cost(per_row_s=1e-5, per_batch_s=c0), bound_s=1.0)
        end = stream(controller, rate=1.0 / (c0 + 1e-5 + 2e-4), seconds=2.0)
        assert controller.choose(end)[0] == 0.0, c0


def test_adapts_as_the_rate_changes() -> None:
    controller = AutoTimeout(cost(per_row_s=1e-5, per_batch_s=5e-3), bound_s=0.05)
    end = stream(controller, rate=2000, seconds=0.5)
    assert controller.choose(end)[0] > 0.0
    end = stream(controller, rate=50, seconds=1.0, start=end)  # the load drops
    assert controller.choose(end)[0] == 0.0


def test_cost_model_fits_per_row_and_per_batch_cost() -> None:
    cost = BatchCost(per_row_s=0.0, per_batch_s=0.0, memory=64)
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 65))
        cost.observe(n, 0.002 + 0.0001 * n + float(rng.normal(0, 1e-5)))
    assert cost.per_row_s == pytest.approx(0.0001, rel=0.05)
    assert cost.per_batch_s == pytest.approx(0.002, rel=0.05)
    assert cost.predict(64) == pytest.approx(0.0084, rel=0.02)


def test_cost_model_with_one_batch_size_keeps_a_sane_slope() -> None:
    """Under steady load every batch is full: the fit must still predict that size exactly and
    never go negative for smaller ones."""
    cost = BatchCost(per_row_s=1e-5, per_batch_s=5e-4, memory=32)
    for _ in range(500):
        cost.observe(64, 0.02)
    assert cost.predict(64) == pytest.approx(0.02, rel=0.02)
    assert 0 <= cost.predict(1) <= 0.02 and cost.per_row_s >= 0 and cost.per_batch_s >= 0


def test_cost_model_follows_a_change_of_speed() -> None:
    cost = BatchCost(per_row_s=1e-5, per_batch_s=5e-4, memory=32)
    for n in range(1, 400):
        cost.observe(1 + n % 64, 0.001 + 1e-5 * (1 + n % 64))
    for n in range(1, 400):
        cost.observe(1 + n % 64, 0.01 + 1e-4 * (1 + n % 64))  # the machine got 10x slower
    assert cost.predict(32) == pytest.approx(0.01 + 32e-4, rel=0.1)
