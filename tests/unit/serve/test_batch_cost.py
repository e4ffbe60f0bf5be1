"""``serve.batch_timeout_ms = "auto"``: the controller on a synthetic clock, then the batcher
with it (a real ``livefit serve`` exporting the chosen value:
``tests/e2e/test_batch_timeout_serve.py``)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from livefit.server.config.model_tables import ServeSettings
from livefit.server.serve.batch_cost import ArrivalRate, AutoTimeout, BatchCost
from livefit.server.serve.batcher import RequestBatcher


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


def test_the_setting_accepts_auto_and_numbers_only() -> None:
    assert ServeSettings(batch_timeout_ms="auto").batch_timeout_ms == "auto"
    assert ServeSettings(batch_timeout_ms="5").batch_timeout_ms == 5.0
    for bad in (-1, 10_001, "soon", float("nan")):
        with pytest.raises(ValueError, match="batch_timeout_ms"):
            ServeSettings(batch_timeout_ms=bad)


class Model:
    """Doubles its input and records each call's rows."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        with self.lock:
            self.calls.append(int(rows.shape[0]))
        return rows * 2.0, 1


def one_row(value: float) -> np.ndarray:
    return np.full((1, 2), value, dtype=np.float32)


class Steady(ArrivalRate):
    """A rate that reads the same at every instant (the test's synthetic arrivals)."""

    def __init__(self, rows_per_s: float) -> None:
        super().__init__()
        self.fixed = rows_per_s

    def add(self, rows: int, now: float) -> None:
        pass

    def rate(self, now: float) -> float:
        return self.fixed


def test_batcher_with_auto_answers_a_lone_request_at_once() -> None:
    async def main() -> None:
        model = Model()
        batcher = RequestBatcher("m", model, max_batch_size=8, batch_timeout_ms="auto",
                                 max_queue_rows=100)  # fmt: skip
        batcher.start()
        try:
            for i in range(5):
                result = await batcher.submit(one_row(i), 10)
                assert result.outputs[0, 0] == 2.0 * i
            assert model.calls == [1] * 5 and batcher.timeout_s() == 0.0
        finally:
            await batcher.stop()

    asyncio.run(main())


def test_batcher_with_auto_waits_for_its_target_then_fires_at_once() -> None:
    async def main() -> None:
        model = Model()
        # 0.5 s a batch, 10 rows/s: K = (5 - 1) / 1 = 4 rows, w = 3 / 10 = 0.3 s
        batcher = RequestBatcher("m", model, max_batch_size=16, batch_timeout_ms="auto",
                                 max_queue_rows=100, cost=cost(0.0, 0.5),
                                 max_batch_timeout_ms=60_000)  # fmt: skip
        assert batcher.auto is not None
        batcher.auto.rate = Steady(10.0)
        batcher.start()
        try:
            first = [asyncio.create_task(batcher.submit(one_row(i), 60)) for i in range(3)]
            done, _ = await asyncio.wait(first, timeout=0.1)
            assert not done and model.calls == []  # 3 rows < K and well within 0.3 s
            assert batcher.timeout_s() == pytest.approx(0.3, rel=0.01)
            last = asyncio.create_task(batcher.submit(one_row(3), 60))
            done, _ = await asyncio.wait([*first, last], timeout=0.25)
            assert len(done) == 4 and model.calls == [4]  # the 4th row fired it, not the timer
        finally:
            await batcher.stop()

    asyncio.run(main())


def test_batcher_times_the_model_call_for_auto_by_its_clock() -> None:
    """On a CPU the caller passes the model thread's CPU clock: "auto" fits what it reads, while
    the admission's costs keep wall time."""
    ticks = iter(range(0, 1000, 2))  # every call of the clock is 2 "seconds" later

    async def main() -> None:
        batcher = RequestBatcher("m", Model(), max_batch_size=8, batch_timeout_ms="auto",
                                 max_queue_rows=100, auto_clock=lambda: float(next(ticks)))  # fmt: skip
        assert batcher.auto is not None
        batcher.start()
        try:
            for i in range(20):
                await batcher.submit(one_row(i), 10)
        finally:
            await batcher.stop()
        assert batcher.auto.cost.predict(1) > 1.0  # fitted from the 2 s the clock said
        assert batcher.model_cost.predict(1) < 1.0  # wall time: a doubling takes microseconds

    asyncio.run(main())
