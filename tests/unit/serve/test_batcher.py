"""The request batcher, deterministic: huge timeouts so only size decides, then exact checks;
and the batcher with ``batch_timeout_ms = "auto"``, its arrival rate fixed by the test."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from livefit.server.serve.admission import QueueFull
from livefit.server.serve.batch_cost import ArrivalRate, BatchCost
from livefit.server.serve.batch_types import BatchStats, DeadlineExceeded, Prediction
from livefit.server.serve.batcher import RequestBatcher

HUGE_MS = 1e9


class FakeModel:
    """Doubles its input; records every call's row count; optionally blocks or fails."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        self.gate.wait(10)
        self.calls.append(rows.shape[0])
        if self.fail is not None:
            raise self.fail
        return rows * 2.0, len(self.calls)


def run(test: Callable[..., Awaitable[None]], **kwargs: object) -> None:
    async def main() -> None:
        model = FakeModel()
        stats: list[BatchStats] = []
        options = {"max_batch_size": 4, "batch_timeout_ms": HUGE_MS, "max_queue_rows": 100}
        options.update(kwargs)
        batcher = RequestBatcher("m", model, on_batch=stats.append, **options)  # type: ignore[arg-type]
        batcher.start()
        try:
            await test(batcher, model, stats)
        finally:
            await batcher.stop()

    asyncio.run(main())


def rows(n: int, value: float = 1.0) -> np.ndarray:
    return np.full((n, 2), value, dtype=np.float32)


def test_size_flush_only_when_full() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        first = [asyncio.create_task(batcher.submit(rows(1, i), 60)) for i in range(3)]
        done, _ = await asyncio.wait(first, timeout=0.1)
        assert not done and model.calls == []  # 3 rows < 4: nothing fires with a huge timeout
        last = asyncio.create_task(batcher.submit(rows(1, 3), 60))
        results = await asyncio.gather(*first, last)
        assert model.calls == [4]
        assert [float(r.outputs[0, 0]) for r in results] == [0.0, 2.0, 4.0, 6.0]
        assert {r.version for r in results} == {1}
        assert stats[0].rows == 4 and stats[0].requests == 4

    run(body)


def test_small_timeout_fires_with_one_request() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        result = await asyncio.wait_for(batcher.submit(rows(1), 60), 5)
        assert model.calls == [1] and result.outputs.shape == (1, 2)

    run(body, batch_timeout_ms=5)


def test_concurrent_requests_share_model_calls() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        results = await asyncio.gather(*(batcher.submit(rows(1, i), 60) for i in range(64)))
        assert len(model.calls) <= 64 // 16  # far fewer calls than requests
        assert [float(r.outputs[0, 0]) for r in results] == [2.0 * i for i in range(64)]

    run(body, max_batch_size=16, batch_timeout_ms=20)


def test_multi_row_request_is_never_split() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        a = asyncio.create_task(batcher.submit(rows(3, 1), 60))
        b = asyncio.create_task(batcher.submit(rows(3, 2), 60))
        c = asyncio.create_task(batcher.submit(rows(1, 3), 60))
        ra, rb, rc = await asyncio.gather(a, b, c)
        assert model.calls == [3, 4]  # a alone (b would overflow 4), then b + c
        assert ra.outputs.shape == (3, 2) and rb.outputs.shape == (3, 2)
        assert ra.version == 1 and rb.version == rc.version == 2

    run(body, batch_timeout_ms=20)


def test_request_larger_than_batch_runs_alone() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        result = await batcher.submit(rows(10), 60)
        assert model.calls == [10] and result.outputs.shape == (10, 2)

    run(body)


def test_exception_reaches_every_member() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        model.fail = ValueError("boom")
        results = await asyncio.gather(
            *(batcher.submit(rows(1), 60) for _ in range(4)), return_exceptions=True
        )
        assert all(isinstance(r, ValueError) and str(r) == "boom" for r in results)
        model.fail = None
        ok = await asyncio.gather(*(batcher.submit(rows(1), 60) for _ in range(4)))
        assert len(ok) == 4  # the batcher kept running

    run(body)


def test_cancelled_requests_are_dropped() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        gone = [asyncio.create_task(batcher.submit(rows(1, 9), 60)) for _ in range(2)]
        await asyncio.sleep(0.01)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        kept = await asyncio.gather(*(batcher.submit(rows(1), 60) for _ in range(4)))
        assert model.calls == [4]  # the two cancelled ones never reached the model
        assert all(float(r.outputs[0, 0]) == 2.0 for r in kept)

    run(body)


def test_expired_request_gets_deadline_and_never_reaches_model() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(rows(1), 0.05)
        await asyncio.gather(*(batcher.submit(rows(1), 60) for _ in range(4)))
        assert model.calls == [4]

    run(body)


def test_full_queue_rejects_with_retry_hint() -> None:
    async def body(batcher: RequestBatcher, model: FakeModel, stats: list[BatchStats]) -> None:
        model.gate.clear()  # the model is busy: requests pile up
        busy = asyncio.create_task(batcher.submit(rows(4), 60))
        await asyncio.sleep(0.05)
        queued = [asyncio.create_task(batcher.submit(rows(4), 60)) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull) as caught:
            await batcher.submit(rows(4), 60)
        assert caught.value.retry_after_s >= 1
        model.gate.set()
        await asyncio.gather(busy, *queued)
        assert batcher.queued_rows == 0

    run(body, max_queue_rows=8)


def test_stop_fails_queued_requests_instead_of_hanging() -> None:
    async def main() -> None:
        model = FakeModel()
        batcher = RequestBatcher("m", model, max_batch_size=4, batch_timeout_ms=HUGE_MS,
                                 max_queue_rows=100)  # fmt: skip
        batcher.start()
        pending = asyncio.create_task(batcher.submit(rows(1), 60))
        await asyncio.sleep(0.01)
        await batcher.stop()
        with pytest.raises(RuntimeError, match="shutting down"):
            await pending

    asyncio.run(main())


def test_inline_batch_cycle_counts_the_answers_loop_work_and_refuses_by_it() -> None:
    """An inline model's call costs microseconds, but its answers cost the event loop their
    handlers' work (serializing and writing the response). The batch cycle must count that
    work, so that admission refuses once the queue's real wait is over the bound."""
    answer_s = 200e-6  # each handler's work on the loop after its answer

    async def main() -> tuple[float, list[object]]:
        batcher = RequestBatcher(
            "m", FakeModel(), max_batch_size=8, batch_timeout_ms=0, max_queue_rows=10_000,
            max_queue_wait_ms=20.0, inline=True,
        )  # fmt: skip
        batcher.start()

        async def handler(value: float) -> Prediction:
            answer = await batcher.submit(rows(1, value), 30.0)
            until = time.perf_counter() + answer_s
            while time.perf_counter() < until:  # writing the answer, on the loop
                pass
            return answer

        try:
            for _ in range(8):  # rounds of 8 concurrent requests: the cost is learned
                await asyncio.gather(*(handler(float(i)) for i in range(8)))
            learned = batcher.cost.predict(8)
            # 200 requests at once (all admitted or refused before the batcher runs again)
            tasks = [asyncio.create_task(handler(float(i))) for i in range(200)]
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            return learned, outcomes
        finally:
            await batcher.stop()

    learned, outcomes = asyncio.run(main())
    refused = [o for o in outcomes if isinstance(o, QueueFull)]
    answered = [o for o in outcomes if isinstance(o, Prediction)]
    print(f"learned batch of 8: {learned * 1e3:.2f} ms; {len(refused)} refused, "
          f"{len(answered)} answered")  # fmt: skip
    # each batch of 8 costs the loop at least 8 answers' work (the busy-wait), whatever the load
    assert learned >= 0.75 * 8 * answer_s
    assert len(refused) + len(answered) == 200
    assert all(o.reason == "wait" for o in refused)
    # 20 ms admits about 12 batches of 1.6 ms or more; the rest is refused at once
    assert 50 <= len(refused) <= 200 - 8


def cost(per_row_s: float, per_batch_s: float) -> BatchCost:
    return BatchCost(per_row_s=per_row_s, per_batch_s=per_batch_s)


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
        # 1 s a batch, 5 rows/s: K = (5 - 1) / 1 = 4 rows, w = 3 / 5 = 0.6 s (long beside the
        # 0.1 s checks below, for a test worker that waits for a core)
        batcher = RequestBatcher("m", model, max_batch_size=16, batch_timeout_ms="auto",
                                 max_queue_rows=100, cost=cost(0.0, 1.0),
                                 max_batch_timeout_ms=60_000)  # fmt: skip
        assert batcher.auto is not None
        batcher.auto.rate = Steady(5.0)
        batcher.start()
        try:
            first = [asyncio.create_task(batcher.submit(one_row(i), 60)) for i in range(3)]
            done, _ = await asyncio.wait(first, timeout=0.1)
            assert not done and model.calls == []  # 3 rows < K and well within 0.6 s
            assert batcher.timeout_s() == pytest.approx(0.6, rel=0.01)
            last = asyncio.create_task(batcher.submit(one_row(3), 60))
            done, _ = await asyncio.wait([*first, last], timeout=0.4)
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
