"""Timeout-based request batching with admission by expected wait: one asyncio batcher per model.

Like Ray Serve's ``_BatchQueue``: a queue, a future per request, one background task. The timer
starts when the oldest queued request arrived; a batch fires when ``max_batch_size`` rows are
queued or ``batch_timeout_ms`` has passed since then; with 0 (the default) a batch is whatever
queued while the model was busy with the previous one. "auto" chooses the timeout for each
batch from the measured arrival rate and batch cost (``AutoTimeout``), up to
``max_batch_timeout_ms``: 0 unless waiting lowers the mean latency. A multi-row request counts
by its rows and is never split (it runs whole, on one version). Requests whose client went
away or whose deadline passed are dropped before the model call; an exception from the model
call reaches every request of its batch. The model call runs in a single-thread executor, off
the loop; a model whose call costs less than the hand-over to that thread and back (``inline``:
a NumPy forward pass of a few microseconds, ``ServingModel.runs_inline``) is called on the loop
itself, which is then its model thread; after each such batch the batcher yields to the loop
before the next, so the answers are written and new requests read (and refused) in between,
and the answered handlers' run counts in the batch cycle admission predicts waits from.
A request for a past version (``submit(pinned=snapshot)``, the versioned paths) is batched only
with requests for the same version, oldest first, and computed by ``predict_version``; the
requests it passes over keep their places in the queue.

This module owns the queue, the batch loop and the model thread. Admission by expected wait
(``submit`` refuses at once with ``QueueFull`` a request that cannot be served in time) is the
``AdmissionControl`` each batcher owns (``admission``), told here when batches start and end;
the batch cost and the "auto" timeout are ``batch_cost``'s; what goes in and out is
``batch_types``'.
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
from typing import Literal

import numpy as np

from ..wire.snapshot import Snapshot
from .admission import AdmissionControl, Reservation
from .batch_cost import AutoTimeout, BatchCost
from .batch_types import BatchStats, DeadlineExceeded, PredictFn, Prediction, PredictVersionFn

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    """A queued request: its rows, the future its answer is set on, when it was queued, its
    deadline and when a batch took it."""

    rows: np.ndarray
    future: asyncio.Future[Prediction]
    enqueued_at: float
    deadline: float
    taken_at: float = field(default=0.0)
    pinned: Snapshot | None = None  # a past version asked for; None: the newest

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def version_key(self) -> tuple[str, int] | None:
        """What a batch must share: the version asked for (None: the newest)."""
        pinned = self.pinned
        return None if pinned is None else (pinned.lineage, pinned.version)


class RequestBatcher:
    """Groups concurrent requests of one model into model calls; its ``admission`` decides
    which requests it can take in time."""

    def __init__(
        self,
        name: str,
        predict: PredictFn,
        max_batch_size: int,
        batch_timeout_ms: float | Literal["auto"],
        max_queue_rows: int,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_queue_change: Callable[[int], None] | None = None,
        max_queue_wait_ms: float | Literal["auto"] | None = None,
        cost: BatchCost | None = None,
        on_refuse: Callable[[str], None] | None = None,
        max_batch_timeout_ms: float = 10.0,
        auto_clock: Callable[[], float] = time.monotonic,
        inline: bool = False,
        predict_version: PredictVersionFn | None = None,
    ) -> None:
        """``batch_timeout_ms``: how long the oldest request may wait for company ("auto":
        chosen per batch by ``AutoTimeout``, at most ``max_batch_timeout_ms``, from model calls
        timed by ``auto_clock``: ``time.thread_time`` for a model on CPU, see below).
        ``max_queue_wait_ms``: the longest expected wait a request is admitted with
        ("auto": ``AUTO_WAIT_BATCHES`` full-batch model calls, at least ``AUTO_WAIT_FLOOR_S``;
        None: no bound but the deadline).
        ``cost``: the batch cost model (a default prior when None). ``on_refuse(reason)`` is
        called for each refused request. ``inline``: call the model on the event loop instead
        of the model thread (for calls cheaper than two thread hand-overs).
        ``predict_version``: the call for requests pinned to a past version."""
        self.name = name
        self.inline = inline
        self.predict = predict
        self.predict_version = predict_version
        self._pinned_queued = 0  # queued requests pinned to a version: batches then sort
        self.max_batch_size = max_batch_size
        self._init_costs(cost, batch_timeout_ms, max_batch_timeout_ms, auto_clock)
        self.on_batch = on_batch
        self.on_queue_change = on_queue_change
        self.model_calls = 0
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{name}")
        self._task: asyncio.Task[None] | None = None
        self.admission = AdmissionControl(
            name,
            max_batch_size,
            cost=self.cost,
            model_cost=self.model_cost,
            queued_rows=lambda: self._queued_rows,
            max_queue_rows=max_queue_rows,
            max_queue_wait_ms=max_queue_wait_ms,
            on_refuse=on_refuse,
        )

    def _init_costs(
        self,
        cost: BatchCost | None,
        batch_timeout_ms: float | Literal["auto"],
        max_batch_timeout_ms: float,
        auto_clock: Callable[[], float],
    ) -> None:
        """The batch cost, the model call's cost and the batch timeout ("auto": an
        ``AutoTimeout`` with a cost of its own), from ``__init__``'s arguments."""
        max_batch_size = self.max_batch_size
        self.cost = cost if cost is not None else BatchCost(prior_rows=max_batch_size)
        # the model call alone (no hand-over, no event loop): sets the "auto" wait bound
        self.model_cost = BatchCost(self.cost.per_row_s, self.cost.per_batch_s, 32, max_batch_size)
        # "auto" weighs what merging two batches saves: one model call's fixed cost. Not the
        # batch cycle (self.cost): the event loop's time around a batch is the requests' HTTP
        # work, whatever the batching. On a CPU the call's wall time also counts waiting for
        # the GIL (held by the event loop) and for cores other processes hold, which merging
        # does not save, so the caller times it by the model thread's CPU time there; on a GPU
        # the device's time is the cost, and wall time measures it.
        self._auto_clock = auto_clock
        self._auto_seconds = 0.0
        self.auto: AutoTimeout | None = None
        if batch_timeout_ms == "auto":
            self.batch_timeout_s = 0.0
            prior = BatchCost(self.cost.per_row_s, self.cost.per_batch_s, 32, max_batch_size)
            self.auto = AutoTimeout(prior, max_batch_timeout_ms / 1000.0)
        else:
            self.batch_timeout_s = batch_timeout_ms / 1000.0
        self._model_seconds = 0.0

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._loop(), name=f"batcher-{self.name}")
        self.admission.start(loop)

    async def stop(self) -> None:
        """Stop the background task; queued requests fail with an error, never hang."""
        self.admission.stop()
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
        self._pinned_queued = 0
        self._executor.shutdown(wait=True)

    def timeout_s(self) -> float:
        """The batch timeout in force: the fixed one, or the one "auto" chose last."""
        return self.auto.timeout_s if self.auto is not None else self.batch_timeout_s

    async def submit(
        self, rows: np.ndarray, timeout_s: float, reservation: Reservation | None = None,
        pinned: Snapshot | None = None,
    ) -> Prediction:  # fmt: skip
        """Queue ``rows`` and wait for their outputs; raises QueueFull (at once, before any
        waiting) or DeadlineExceeded. ``reservation``, the request's place held since its
        admission, is given back first. ``pinned``: compute with that kept version's weights
        (``predict_version``), not the newest."""
        if reservation is not None:
            reservation.release()
        if pinned is not None and self.predict_version is None:
            raise RuntimeError(f"model {self.name} serves no past versions")
        n = int(rows.shape[0])
        self.admission.admit(n, timeout_s, wait_bound=reservation is None)
        now = time.monotonic()
        future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
        pending = _Pending(rows=rows, future=future, enqueued_at=now, deadline=now + timeout_s,
                           pinned=pinned)  # fmt: skip
        self._queue.append(pending)
        self._queued_rows += n
        self._pinned_queued += pinned is not None
        if self.auto is not None:
            self.auto.arrived(n, now)
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
        """Run ``fn`` on the model's thread, between batches (e.g. a weight swap); for an
        inline model, now, on the loop (no batch runs while the loop runs ``fn``)."""
        loop = asyncio.get_running_loop()
        if not self.inline:
            return loop.run_in_executor(self._executor, fn)
        done: asyncio.Future[object] = loop.create_future()
        try:
            done.set_result(fn())
        except Exception as exc:
            done.set_exception(exc)
        return done

    async def _loop(self) -> None:
        while True:
            try:
                await self._wait_for_batch()
                batch = self._take_batch()
                if batch:
                    await self._cycle(batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batcher %s failed; continuing", self.name)

    async def _cycle(self, batch: list[_Pending]) -> None:
        """Run one batch; a successful one's time (call, hand-over and answers) feeds the cost.

        An inline model's call never yields, so the batch is answered in microseconds while
        the work of its answers (each handler waking up, serializing and writing its response:
        most of a batch's real cost to the event loop) would run after the cycle was timed,
        and between no two batches; the expected wait would then count only the model call
        and admit nearly everything. So the cycle yields to the event loop after answering
        before it ends, and counts the answered handlers' run in it: a mark scheduled before
        the answers runs just before their handlers (callbacks run in the order scheduled),
        the batcher resumes just after them, and the cycle is the call plus that span. What
        else the loop does in between (reading and refusing new requests) is left out: it is
        not this batch's cost, and counting it made the wait grow with the refusal rate."""
        rows = sum(p.size for p in batch)
        started = time.monotonic()
        self.admission.batch_started(rows, started)
        marks: list[float] = []
        try:
            if self.inline:
                asyncio.get_running_loop().call_soon(lambda: marks.append(time.monotonic()))
            ok = await self._run(batch)
            answered = time.monotonic()
            if self.inline:
                await asyncio.sleep(0)  # the answered handlers run now (see above)
        finally:
            self.admission.batch_done()
        if ok:
            now = time.monotonic()
            seconds = now - started
            if marks:  # the call, then the handlers' run (from the mark to now)
                seconds = answered - started + max(0.0, now - marks[0])
            self.cost.observe(rows, seconds)

    async def _wait_for_batch(self) -> None:
        """Return once enough rows are queued (``max_batch_size``, or fewer as "auto" decides)
        or the oldest waited the timeout."""
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        timeout, enough = self._batch_window()
        while self._queued_rows < enough:
            remaining = self._queue[0].enqueued_at + timeout - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return
            if not self._queue:
                return

    def _batch_window(self) -> tuple[float, int]:
        """(timeout in seconds, rows that fire the batch at once) for the batch forming now."""
        if self.auto is None:
            return self.batch_timeout_s, self.max_batch_size
        timeout, target = self.auto.choose(time.monotonic())
        return timeout, max(1, min(self.max_batch_size, math.ceil(target)))

    def _take_batch(self) -> list[_Pending]:
        """Up to ``max_batch_size`` rows of live requests, oldest first, none split; all for
        the version the oldest asks for (``_take_version``) while pinned requests are queued."""
        if self._pinned_queued:
            return self._take_version()
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

    def _take_version(self) -> list[_Pending]:
        """``_take_batch`` over a queue holding pinned requests: the oldest live request's
        version decides, later requests for it join while they fit, the others stay queued in
        their order (one pass over the queue)."""
        batch: list[_Pending] = []
        rows = 0
        now = time.monotonic()
        key: tuple[str, int] | None = None
        full = False
        kept: deque[_Pending] = deque()
        for pending in self._queue:
            if pending.future.done() or pending.deadline <= now:
                self._dropped(pending)
                if not pending.future.done():
                    pending.future.set_exception(
                        DeadlineExceeded(f"deadline passed while queued for model {self.name}")
                    )
                continue
            if not batch:
                key = pending.version_key
            elif full or pending.version_key != key or rows + pending.size > self.max_batch_size:
                full = full or pending.version_key == key  # none may pass a request that waits
                kept.append(pending)
                continue
            self._dropped(pending)
            pending.taken_at = now
            batch.append(pending)
            rows += pending.size
        self._queue = kept
        self._queue_changed()
        return batch

    def _dropped(self, pending: _Pending) -> None:
        """``pending`` leaves the queue (taken, cancelled or past its deadline)."""
        self._queued_rows -= pending.size
        self._pinned_queued -= pending.pinned is not None
        self.admission.queue_shrank()

    def _pop(self) -> None:
        self._dropped(self._queue.popleft())

    async def _run(self, batch: list[_Pending]) -> bool:
        rows = batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch])
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            pinned = batch[0].pinned
            if self.inline:
                outputs, version = self._timed(rows, pinned)
            else:
                outputs, version = await loop.run_in_executor(
                    self._executor, self._timed, rows, pinned
                )
            if outputs.shape[0] != rows.shape[0]:
                raise RuntimeError(
                    f"model {self.name} returned {outputs.shape[0]} rows for {rows.shape[0]} inputs"
                )
        except Exception as exc:
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return False
        finally:
            self.model_calls += 1
        elapsed = time.monotonic() - started
        self.model_cost.observe(int(rows.shape[0]), self._model_seconds)
        if self.auto is not None:
            self.auto.cost.observe(int(rows.shape[0]), self._auto_seconds)
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
        return True

    def _timed(self, rows: np.ndarray, pinned: Snapshot | None) -> tuple[np.ndarray, int]:
        """The model call (with ``pinned``'s weights when given), on the model thread, timed
        there (``model_cost``, and by ``auto_clock`` for "auto")."""
        started, clock = time.monotonic(), self._auto_clock()
        if pinned is not None and self.predict_version is not None:
            result = self.predict_version(rows, pinned)
        else:
            result = self.predict(rows)
        self._model_seconds = time.monotonic() - started
        self._auto_seconds = self._auto_clock() - clock
        return result

    def _queue_changed(self) -> None:
        if self.on_queue_change is not None:
            self.on_queue_change(self._queued_rows)
