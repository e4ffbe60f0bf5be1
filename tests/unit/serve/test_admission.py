"""Admission by expected wait: the batcher refuses at once what it cannot serve in time.

The model here is a stand-in whose calls take a known time (a sleep of ``per_batch + per_row *
rows``), so the batch cost the batcher fits online (``test_batch_cost.py``) has a known answer. No test asserts how fast
anything ran: they check what was admitted, how deep the queue got (in rows, which does not
depend on the machine's speed: the wait bound is a number of batch times) and that refusals
happen before the request ever waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.serve.admission import QueueFull, Reservation
from livefit.server.serve.batch_cost import BatchCost
from livefit.server.serve.batch_types import DeadlineExceeded, Prediction
from livefit.server.serve.batcher import RequestBatcher
from livefit.server.serve.endpoint import ModelEndpoint


class TimedModel:
    """Each call sleeps ``per_batch + per_row * rows`` seconds; ``gate`` can hold calls."""

    def __init__(self, per_batch: float, per_row: float = 0.0) -> None:
        self.per_batch = per_batch
        self.per_row = per_row
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        self.gate.wait(30)
        time.sleep(self.per_batch + self.per_row * rows.shape[0])
        self.calls.append(int(rows.shape[0]))
        return rows[:, :1] * 2.0, 1


class FakeServing:
    """What ``ModelEndpoint`` needs from a serving model: ``predict`` and a snapshot source."""

    def __init__(self, model: TimedModel) -> None:
        self.predict = model

    def source(self) -> object:
        return object()  # "weights exist"

    def refresh(self) -> None:
        pass


def rows(n: int) -> np.ndarray:
    return np.ones((n, 2), dtype=np.float32)


def refused_at_once(batcher: RequestBatcher, n: int, timeout_s: float) -> QueueFull | None:
    """Run ``submit`` up to its first suspension: a refusal must come before any waiting."""
    coro = batcher.submit(rows(n), timeout_s)
    try:
        coro.send(None)
    except QueueFull as exc:
        return exc
    except StopIteration:
        raise AssertionError("submit returned without waiting for the model") from None
    coro.close()  # admitted: it suspended to wait for its batch; drop it
    return None


@contextlib.asynccontextmanager
async def started(
    model: TimedModel, warm: int = 0, **settings: object
) -> AsyncIterator[RequestBatcher]:
    """A running batcher over ``model`` (batches of 4, no timeout, 1,000 queued rows unless
    ``settings`` say otherwise) that has timed ``warm`` full batches, so its cost model knows
    the model; on exit the model's gate opens and the batcher stops."""
    options: dict[str, object] = {"max_batch_size": 4, "batch_timeout_ms": 0,
                                  "max_queue_rows": 1000, **settings}  # fmt: skip
    batcher = RequestBatcher("m", model, **options)
    batcher.start()
    try:
        for _ in range(warm):
            await batcher.submit(rows(4), 10)
        yield batcher
    finally:
        model.gate.set()
        await batcher.stop()


def test_a_request_that_cannot_meet_its_deadline_is_refused_at_once() -> None:
    """It used to be queued and answered 504 at its deadline, having held a queue slot (and
    the client) for nothing."""

    async def main() -> None:
        model = TimedModel(per_batch=0.03)
        async with started(model, warm=6) as batcher:
            model.gate.clear()  # the model is now busy with a batch ...
            pending = [asyncio.create_task(batcher.submit(rows(4), 10)) for _ in range(11)]
            await asyncio.sleep(0.05)  # ... and 10 full batches (~0.3 s of work) are queued
            refusal = refused_at_once(batcher, 1, 0.1)
            assert refusal is not None, "admitted a request that had to wait past its deadline"
            assert refusal.reason == "deadline" and refusal.retry_after_s >= 1
            model.gate.set()
            done = await asyncio.gather(*pending)
            assert all(isinstance(p, Prediction) for p in done)

    asyncio.run(main())


def test_an_idle_model_always_takes_a_request() -> None:
    """Whatever the cost model says, an empty queue and an idle model admit: admission must
    never refuse everything on a bad estimate."""

    async def main() -> None:
        model = TimedModel(per_batch=0.0)
        cost = BatchCost(per_row_s=10.0, per_batch_s=10.0)  # absurd: 10 s a row
        async with started(model, max_queue_rows=100, max_queue_wait_ms=1, cost=cost) as batcher:
            result = await batcher.submit(rows(1), 0.5)
            assert result.outputs.shape == (1, 1)

    asyncio.run(main())


def test_a_stalled_model_makes_the_expected_wait_grow() -> None:
    """A batch running far past its predicted time counts as still running: requests behind
    it are refused instead of joining a queue that does not move."""

    async def main() -> None:
        model = TimedModel(per_batch=0.005)
        async with started(model, warm=6, max_queue_wait_ms=50) as batcher:
            model.gate.clear()
            stuck = asyncio.create_task(batcher.submit(rows(4), 10))
            queued = asyncio.create_task(batcher.submit(rows(4), 10))  # the next batch, full
            await asyncio.sleep(0.01)
            assert refused_at_once(batcher, 1, 10) is None  # just started: room to wait
            await asyncio.sleep(0.3)  # 60x its predicted time
            refusal = refused_at_once(batcher, 1, 10)
            assert refusal is not None and refusal.reason == "wait"
            model.gate.set()
            await asyncio.gather(stuck, queued)

    asyncio.run(main())


def test_open_loop_overload_keeps_the_queue_short_and_never_times_out() -> None:
    """Three times the model's capacity, open loop, at the default serve settings: the queue
    stays within a few batches (it grew to thousands of rows, and requests waited for their
    deadlines), every refusal is immediate, and no admitted request misses its deadline."""

    async def main() -> None:
        model = TimedModel(per_batch=0.02, per_row=0.0005)
        settings = ModelSettings.model_validate(
            {"input_shape": [2], "output_shape": [1], "serve": {"max_batch_size": 8}}
        )
        served = ModelEndpoint("m", settings, FakeServing(model))  # type: ignore[arg-type]
        depths: list[int] = []
        served.start_batching(Metrics())
        batcher = served.batcher
        assert batcher is not None
        watch = batcher.on_queue_change

        def record(depth: int) -> None:
            depths.append(depth)
            if watch is not None:
                watch(depth)

        batcher.on_queue_change = record
        capacity = 8 / (0.02 + 0.0005 * 8)  # rows/s
        rate, seconds = 3 * capacity, 2.0
        outcomes = {"ok": 0, "refused_at_once": 0, "504": 0, "429_later": 0}
        admitted: list[asyncio.Task[Prediction]] = []

        try:
            started = time.monotonic()
            sent = 0
            while time.monotonic() - started < seconds:
                due = int((time.monotonic() - started) * rate)
                fresh = [
                    asyncio.create_task(batcher.submit(rows(1), 1.0)) for _ in range(due - sent)
                ]
                sent = max(sent, due)
                await asyncio.sleep(0)  # each new task runs up to its first wait
                for task in fresh:
                    if task.done() and isinstance(task.exception(), QueueFull):
                        outcomes["refused_at_once"] += 1
                    else:
                        admitted.append(task)
                await asyncio.sleep(0.002)
            for result in await asyncio.gather(*admitted, return_exceptions=True):
                if isinstance(result, Prediction):
                    outcomes["ok"] += 1
                elif isinstance(result, DeadlineExceeded):
                    outcomes["504"] += 1
                elif isinstance(result, QueueFull):
                    outcomes["429_later"] += 1
                else:
                    raise AssertionError(f"unexpected outcome {result!r}")
        finally:
            await served.stop_batching()
        assert outcomes["504"] == 0, outcomes
        assert outcomes["refused_at_once"] > 0 and outcomes["ok"] > 0, outcomes
        # an admitted request never turned into a refusal later: it was admitted to be served
        assert outcomes["429_later"] == 0, outcomes
        # the default wait bound is a few batch times: a few batches of 8 rows, never hundreds
        assert max(depths) <= 4 * 8, (max(depths), outcomes)

    asyncio.run(main())


def test_a_lagging_event_loop_counts_in_the_expected_wait() -> None:
    """When the event loop itself is behind (it also has to read and refuse whatever
    arrives), a request admitted now would wait that long before anyone looks at it: the lag
    is part of the expected wait, so admissions stop until the loop catches up."""

    async def main() -> None:
        model = TimedModel(per_batch=0.002)
        async with started(model, warm=1, max_queue_wait_ms=50) as batcher:
            model.gate.clear()
            stuck = asyncio.create_task(batcher.submit(rows(4), 10))
            queued = asyncio.create_task(batcher.submit(rows(4), 10))  # the next batch, full
            await asyncio.sleep(0.02)
            assert batcher.admission.refusal(1, 10) is None  # busy, but the loop keeps up
            time.sleep(0.2)  # the loop is blocked (as by a burst of work) ...
            for _ in range(3):
                await asyncio.sleep(0)  # ... and the lag watch runs, late
            assert batcher.admission.loop_lag_s > 0.1
            refused = batcher.admission.refusal(1, 10)
            assert refused is not None and refused[0] == "wait"
            model.gate.set()
            await asyncio.gather(stuck, queued)
            # Caught up: the lag fades (a busy machine may delay the loop anew for a moment:
            # it must fade within a few seconds, not stay).
            deadline = time.monotonic() + 5.0
            await asyncio.sleep(0.2)
            while batcher.admission.loop_lag_s >= 0.05 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert batcher.admission.loop_lag_s < 0.05

    asyncio.run(main())


def test_reservations_count_until_the_request_is_queued() -> None:
    """Requests admitted from their heads are not queued yet (their bodies are still to be
    read and parsed), but they will be: every admission after them counts them, and each
    place is given back exactly once."""

    async def main() -> None:
        model = TimedModel(per_batch=0.01)
        async with started(model, warm=4, max_queue_wait_ms=25) as batcher:
            model.gate.clear()
            stuck = asyncio.create_task(batcher.submit(rows(4), 10))
            await asyncio.sleep(0.005)
            held: list[Reservation] = []
            while batcher.admission.refusal(1, 10) is None and len(held) < 100:
                held.append(batcher.admission.reserve(1))
            assert 0 < len(held) < 100  # bounded by the wait, in reserved rows alone
            assert batcher.admission.expected_wait(0)[0] > 0.025
            for reservation in held:
                reservation.release()
                reservation.release()  # idempotent
            model.gate.set()
            await stuck
            admission = batcher.admission
            assert admission.refusal(1, 10) is None and admission.reserved_rows == 0
            done = await batcher.submit(rows(1), 10, batcher.admission.reserve(1))
            assert done.outputs.shape == (1, 1) and batcher.admission.reserved_rows == 0

    asyncio.run(main())


def test_a_request_that_fits_in_the_next_batch_is_refused_only_for_its_deadline() -> None:
    """However long the model takes, up to a batch of requests may wait for the next model
    call (a closed loop of max_batch_size clients is never refused); past that, the wait
    bound acts."""

    async def main() -> None:
        model = TimedModel(per_batch=0.005)
        async with started(model, warm=4, max_queue_wait_ms=1) as batcher:
            model.gate.clear()
            stuck = asyncio.create_task(batcher.submit(rows(4), 10))
            await asyncio.sleep(0.05)  # far past the 1 ms bound
            waiting = [asyncio.create_task(batcher.submit(rows(1), 10)) for _ in range(3)]
            await asyncio.sleep(0)
            assert batcher.admission.refusal(1, 10) is None  # the 4th row of the next batch
            deadline = ("deadline", pytest.approx(0.05, abs=0.05), 0.001)
            assert batcher.admission.refusal(1, 0.001) == deadline
            last = asyncio.create_task(batcher.submit(rows(1), 10))
            await asyncio.sleep(0)
            assert batcher.admission.refusal(1, 10) is not None  # a 5th row would wait a batch more
            model.gate.set()
            await asyncio.gather(stuck, *waiting, last)

    asyncio.run(main())
