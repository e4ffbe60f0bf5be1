"""Timeout-based request batching: one asyncio batcher per model.

Like Ray Serve's ``_BatchQueue``: a queue, a future per request, one background task. The timer
starts when the oldest queued request arrived; a batch fires when ``max_batch_size`` rows are
queued or ``batch_timeout_ms`` has passed since then; with 0 (the default) a batch is whatever
queued while the model was busy with the previous one. A multi-row request counts by its rows
and is never split (it runs whole, on one version). Requests whose client went away or whose
deadline passed are dropped before the model call; an exception from the model call reaches
every request of its batch. The model call runs in a single-thread executor, off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

PredictFn = Callable[[np.ndarray], tuple[np.ndarray, int]]


class QueueFull(Exception):
    """The model's queue is over ``max_queue_rows`` (HTTP 429); ``retry_after_s`` is a hint."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(Exception):
    """The request's deadline passed before it was served (HTTP 504)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """What a request gets back: its own rows' outputs and the version that computed them."""

    outputs: np.ndarray
    version: int
    queue_seconds: float


@dataclass(slots=True)
class _Pending:
    rows: np.ndarray
    future: asyncio.Future[Prediction]
    enqueued_at: float
    deadline: float
    taken_at: float = field(default=0.0)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Reported after each model call: rows, requests, and how long the call took."""

    rows: int
    requests: int
    seconds: float
    queue_seconds: list[float]


class RequestBatcher:
    """Groups concurrent requests of one model into model calls."""

    def __init__(
        self,
        name: str,
        predict: PredictFn,
        max_batch_size: int,
        batch_timeout_ms: float,
        max_queue_rows: int,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_queue_change: Callable[[int], None] | None = None,
    ) -> None:
        self.name = name
        self.predict = predict
        self.max_batch_size = max_batch_size
        self.batch_timeout_s = batch_timeout_ms / 1000.0
        self.max_queue_rows = max_queue_rows
        self.on_batch = on_batch
        self.on_queue_change = on_queue_change
        self.model_calls = 0
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{name}")
        self._task: asyncio.Task[None] | None = None
        self._batch_seconds = 0.001  # moving estimate of one model call, for Retry-After

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._loop(), name=f"batcher-{self.name}"
        )

    async def stop(self) -> None:
        """Stop the background task; queued requests fail with an error, never hang."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("server is shutting down"))
        self._queued_rows = 0
        self._executor.shutdown(wait=True)

    async def submit(self, rows: np.ndarray, timeout_s: float) -> Prediction:
        """Queue ``rows`` and wait for their outputs; raises QueueFull or DeadlineExceeded."""
        n = int(rows.shape[0])
        if self._queued_rows + n > self.max_queue_rows and self._queued_rows > 0:
            raise QueueFull(
                f"model {self.name} has {self._queued_rows} rows queued "
                f"(max_queue_rows={self.max_queue_rows}); retry later",
                self.retry_after_s(),
            )
        now = time.monotonic()
        future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
        pending = _Pending(rows=rows, future=future, enqueued_at=now, deadline=now + timeout_s)
        self._queue.append(pending)
        self._queued_rows += n
        self._queue_changed()
        self._arrived.set()
        # ``asyncio.timeout`` cancels this await, and with it the future (the batcher then
        # skips the request), as does a client going away. Cheaper than ``wait_for(shield())``,
        # which wraps every request in a task of its own (a third of ``submit``'s time).
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise DeadlineExceeded(
                f"deadline of {timeout_s * 1000:.0f} ms passed before model {self.name} answered"
            ) from None

    def call_in_model_thread(self, fn: Callable[[], object]) -> asyncio.Future[object]:
        """Run ``fn`` on the model's thread, between batches (e.g. a weight swap)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def retry_after_s(self) -> int:
        """Seconds after which the queue has likely drained (at least 1)."""
        batches = self._queued_rows / max(1, self.max_batch_size)
        return max(1, math.ceil(batches * self._batch_seconds))

    async def _loop(self) -> None:
        while True:
            try:
                await self._wait_for_batch()
                batch = self._take_batch()
                if batch:
                    await self._run(batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batcher %s failed; continuing", self.name)

    async def _wait_for_batch(self) -> None:
        """Return once ``max_batch_size`` rows are queued or the oldest waited the timeout."""
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        while self._queued_rows < self.max_batch_size:
            remaining = self._queue[0].enqueued_at + self.batch_timeout_s - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return
            if not self._queue:
                return

    def _take_batch(self) -> list[_Pending]:
        """Up to ``max_batch_size`` rows of live requests, oldest first, none split."""
        batch: list[_Pending] = []
        rows = 0
        now = time.monotonic()
        while self._queue:
            pending = self._queue[0]
            if pending.future.done():  # cancelled: client gone or deadline handled
                self._pop()
                continue
            if pending.deadline <= now:
                self._pop()
                pending.future.set_exception(
                    DeadlineExceeded(f"deadline passed while queued for model {self.name}")
                )
                continue
            if batch and rows + pending.size > self.max_batch_size:
                break
            self._pop()
            pending.taken_at = now
            batch.append(pending)
            rows += pending.size
        self._queue_changed()
        return batch

    def _pop(self) -> None:
        pending = self._queue.popleft()
        self._queued_rows -= pending.size

    async def _run(self, batch: list[_Pending]) -> None:
        rows = batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch])
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            outputs, version = await loop.run_in_executor(self._executor, self.predict, rows)
            if outputs.shape[0] != rows.shape[0]:
                raise RuntimeError(
                    f"model {self.name} returned {outputs.shape[0]} rows for {rows.shape[0]} inputs"
                )
        except Exception as exc:
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        finally:
            self.model_calls += 1
        elapsed = time.monotonic() - started
        self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * elapsed
        offset = 0
        for pending in batch:
            part = outputs[offset : offset + pending.size]
            offset += pending.size
            if not pending.future.done():
                queued = pending.taken_at - pending.enqueued_at
                pending.future.set_result(Prediction(part, version, queued))
        if self.on_batch is not None:
            self.on_batch(
                BatchStats(
                    rows=int(rows.shape[0]),
                    requests=len(batch),
                    seconds=elapsed,
                    queue_seconds=[p.taken_at - p.enqueued_at for p in batch],
                )
            )

    def _queue_changed(self) -> None:
        if self.on_queue_change is not None:
            self.on_queue_change(self._queued_rows)
