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
the loop.

**Admission.** A request is queued only if it can expect to be served in time; otherwise
``submit`` raises ``QueueFull`` at once, before the request waits at all (HTTP 429). The
expected wait until its batch starts is: how far behind the event loop is (its measured lag,
or the age of the oldest request admitted but not yet handled), plus what is left of the
running batch, plus the queued rows (and those of admitted requests on their way) cut into
batches, each timed by a batch cost fitted online (``BatchCost``: ``per_row * rows +
per_batch``, as BentoML's adaptive batcher fits it). A request is refused when that wait is
over ``max_queue_wait`` (TF Serving bounds enqueued batches the same way), when it would be
answered after its deadline (Triton's REJECT timeout policy), or when the queue holds
``max_queue_rows`` rows (a memory bound). "auto" bounds the wait at two full-batch model
calls, and at least ``AUTO_WAIT_FLOOR_S``: on a CPU model the HTTP work around a batch, not
the model, sets the pace. The wait bound applies only to a request that cannot join the next
batch (a full batch is already waiting), so up to ``max_batch_size`` concurrent clients are
never refused but for their deadlines; and an idle model with an empty queue always takes the
request, so a bad estimate can never refuse everything. Under overload the queue stays about a
batch long, the model works on requests that will be answered in time, and the rest are
refused at once instead of waiting for their deadline; counting the event loop's lag keeps the
loop itself responsive (it must still read and refuse everything that arrives).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

log = logging.getLogger(__name__)

PredictFn = Callable[[np.ndarray], tuple[np.ndarray, int]]


AUTO_WAIT_BATCHES = 2.0  # max_queue_wait "auto": this many full-batch model calls ...
AUTO_WAIT_FLOOR_S = 0.05  # ... but at least this: one batch cycle of HTTP work at capacity
LAG_TICK_S = 0.005  # how often the event loop's lag is measured
LAG_HALF_LIFE_S = 0.01  # a lag peak halves every 10 ms
RESERVATION_KEY = "livefit.reservation"  # where a request's Reservation travels in its ASGI scope
REFUSAL_REASONS = ("wait", "deadline", "rows")


def retry_after(wait_s: float) -> int:
    """Retry-After for a refusal with ``wait_s`` of expected wait: whole seconds, at least 1."""
    return max(1, math.ceil(wait_s))


class QueueFull(Exception):
    """Refused at admission (HTTP 429): the expected wait is over ``max_queue_wait``
    (``reason`` "wait"), the request would finish after its deadline ("deadline"), or the queue
    holds ``max_queue_rows`` rows ("rows"). ``retry_after_s`` is a hint, in whole seconds."""

    def __init__(self, message: str, retry_after_s: int, reason: str = "rows") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


class Reservation:
    """A place an admitted request holds until it reaches the queue (or ends): between
    admission from its head and ``submit`` it still has to be read, parsed and routed, and
    every request admitted meanwhile must count it. Until its handler starts (``start``), its
    age is how far behind the event loop is: the oldest such age counts in the expected wait,
    so a saturated loop refuses new requests instead of growing a backlog of admitted ones.
    ``start`` and ``release`` are idempotent."""

    __slots__ = ("_batcher", "_rows", "created")

    def __init__(self, batcher: RequestBatcher, rows: int, created: float) -> None:
        self._batcher: RequestBatcher | None = batcher
        self._rows = rows
        self.created = created

    def start(self) -> None:
        if self._batcher is not None:
            self._batcher._unstarted.pop(self, None)
            self._batcher._verdict = None

    def release(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher._unstarted.pop(self, None)
            batcher._reserved -= self._rows
            batcher._verdict = None


class BatchCost:
    """The time of one batch cycle as a function of its rows: ``per_row * rows + per_batch``.

    Fitted online by exponentially weighted least squares over the last ``memory`` batches
    (older ones fade), so it follows the machine as it gets busier or quieter. A batch cycle
    is measured from the model call's start to the batcher being ready for the next one, so it
    includes handing the batch to the model thread and back. Two prior points (one row and
    ``prior_rows`` rows, from the warm-up timings when known) keep a small constant weight:
    when every batch has the same size (a saturated server), the slope stays defined and the
    prediction for that size is still exactly what was measured. Neither term goes negative.
    """

    PRIOR_WEIGHT = 0.05  # each of the two prior points, against ~``memory`` for the data

    def __init__(
        self, per_row_s: float = 1e-5, per_batch_s: float = 1e-3, memory: int = 32,
        prior_rows: int = 64,
    ) -> None:  # fmt: skip
        self.per_row_s = max(0.0, per_row_s)
        self.per_batch_s = max(0.0, per_batch_s)
        self.observations = 0
        self._decay = 1.0 - 1.0 / max(2, memory)
        w = self.PRIOR_WEIGHT
        points = ((1.0, self.predict(1)), (float(prior_rows), self.predict(prior_rows)))
        self._prior = (
            2 * w,
            w * sum(n for n, _ in points),
            w * sum(n * n for n, _ in points),
            w * sum(t for _, t in points),
            w * sum(n * t for n, t in points),
        )
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # weight, n, n^2, t, n*t (decayed)

    @classmethod
    def from_timings(cls, timings: dict[int, float], memory: int = 32) -> BatchCost:
        """A prior from measured times of a few batch sizes (e.g. the warm-up's)."""
        sizes = sorted(timings)
        if len(sizes) < 2:
            return cls(memory=memory)
        lo, hi = sizes[0], sizes[-1]
        per_row = max(0.0, (timings[hi] - timings[lo]) / (hi - lo))
        return cls(per_row, max(0.0, timings[lo] - per_row * lo), memory, prior_rows=hi)

    def predict(self, rows: int) -> float:
        """Expected seconds for one batch of ``rows`` rows."""
        return self.per_row_s * rows + self.per_batch_s

    def observe(self, rows: int, seconds: float) -> None:
        """Add one measured batch and refit."""
        if not (seconds >= 0.0 and math.isfinite(seconds)):
            return
        d, n, t = self._decay, float(rows), seconds
        s = self._sums
        s[0] = s[0] * d + 1.0
        s[1] = s[1] * d + n
        s[2] = s[2] * d + n * n
        s[3] = s[3] * d + t
        s[4] = s[4] * d + n * t
        self.observations += 1
        self._fit()

    def _fit(self) -> None:
        w, sn, snn, st, snt = (a + b for a, b in zip(self._sums, self._prior, strict=True))
        mean_n, mean_t = sn / w, st / w
        var_n = snn / w - mean_n * mean_n
        cov = snt / w - mean_n * mean_t
        per_row = max(0.0, cov / var_n) if var_n > 1e-12 else self.per_row_s
        per_batch = mean_t - per_row * mean_n
        if per_batch < 0.0:  # the best line through the origin instead
            per_row, per_batch = (snt / snn if snn > 0 else 0.0), 0.0
        self.per_row_s, self.per_batch_s = max(0.0, per_row), per_batch


class ArrivalRate:
    """Rows per second arriving at one batcher, over about the last ``time_constant_s``.

    An exponentially weighted count: each row adds ``1 / time_constant_s`` and the sum fades by
    ``exp(-elapsed / time_constant_s)``, so a steady stream of λ rows/s reads about λ (just
    after an arrival, ``1 / time_constant_s`` more), and a pause lets it fall toward 0.
    Callers pass the clock (``time.monotonic()`` seconds), so tests can drive it.
    """

    __slots__ = ("_at", "_rate", "time_constant_s")

    def __init__(self, time_constant_s: float = 0.1) -> None:
        self.time_constant_s = time_constant_s
        self._rate = 0.0
        self._at = 0.0

    def add(self, rows: int, now: float) -> None:
        """Count ``rows`` arriving at ``now``."""
        tau, rate = self.time_constant_s, self._rate
        if rate and now > self._at:
            rate *= math.exp((self._at - now) / tau)
        self._rate = rate + rows / tau
        self._at = now

    def rate(self, now: float) -> float:
        """The estimate at ``now`` (rows/s)."""
        if self._rate == 0.0:
            return 0.0
        return self._rate * math.exp(-max(0.0, now - self._at) / self.time_constant_s)


class AutoTimeout:
    """``batch_timeout_ms = "auto"``: how long a batch waits for company, and for how many rows.

    From the arrival rate λ (rows/s, ``ArrivalRate``) and the batch cost ``c0 + c1 * n``
    (``BatchCost``: ``per_batch``, ``per_row``). With k rows queued on an idle model, the next
    row comes in g = 1/λ on average. Fired now, that row waits out this batch (c0 + c1 k - g)
    and then runs in its own (c0 + c1): the k + 1 rows' latencies sum to
    k (c0 + c1 k) + (c0 + c1 k - g) + (c0 + c1). Waiting for it instead:
    (k + 1)(c0 + c1 (k + 1)) + k g. Waiting is cheaper by c0 - c1 k - (k + 1) g, so it pays
    while k < K = (λ c0 - 1) / (1 + λ c1). A batch therefore fires once K rows are queued, or
    after the time K - 1 more rows take to arrive after the first: w = (K - 1) / λ, clamped to
    [0, ``bound_s``]. When K <= 1 (rows come further apart than half the fixed cost they
    could share, λ (c0 - c1) <= 2, e.g. a lone client or a CPU model whose cost is mostly per
    row) w = 0: the batch fires at once. After a busy spell the queue already holds the rows
    that came during the last batch, λ (c0 + c1 n) >= λ c0 > K, so the next batch starts as
    soon as the model is free: the timeout only ever delays a batch on an idle model.

    A one-step (myopic) rule for Poisson-like arrivals; the estimates adapt because both the
    rate and the cost are refitted as requests and batches come.
    """

    def __init__(self, cost: BatchCost, bound_s: float, rate: ArrivalRate | None = None) -> None:
        self.cost = cost
        self.bound_s = max(0.0, bound_s)
        self.rate = rate if rate is not None else ArrivalRate()
        self.timeout_s = 0.0  # chosen for the latest batch (exported as a gauge)
        self.target_rows = 1.0

    def arrived(self, rows: int, now: float) -> None:
        """Count a request of ``rows`` rows queued at ``now``."""
        self.rate.add(rows, now)

    def choose(self, now: float) -> tuple[float, float]:
        """(seconds the oldest queued row may wait, rows at which the batch fires at once)."""
        lam = self.rate.rate(now)
        c0, c1 = self.cost.per_batch_s, self.cost.per_row_s
        target = (lam * c0 - 1.0) / (1.0 + lam * c1)
        if target <= 1.0 or lam <= 0.0:
            self.timeout_s, self.target_rows = 0.0, 1.0
        else:
            self.timeout_s = min(self.bound_s, (target - 1.0) / lam)
            self.target_rows = target
        return self.timeout_s, self.target_rows


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
        batch_timeout_ms: float | Literal["auto"],
        max_queue_rows: int,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_queue_change: Callable[[int], None] | None = None,
        max_queue_wait_ms: float | Literal["auto"] | None = None,
        cost: BatchCost | None = None,
        on_refuse: Callable[[str], None] | None = None,
        max_batch_timeout_ms: float = 10.0,
        auto_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``batch_timeout_ms``: how long the oldest request may wait for company ("auto":
        chosen per batch by ``AutoTimeout``, at most ``max_batch_timeout_ms``, from model calls
        timed by ``auto_clock``: ``time.thread_time`` for a model on CPU, see below).
        ``max_queue_wait_ms``: the longest expected wait a request is admitted with
        ("auto": ``AUTO_WAIT_BATCHES`` full-batch model calls, at least ``AUTO_WAIT_FLOOR_S``;
        None: no bound but the deadline).
        ``cost``: the batch cost model (a default prior when None). ``on_refuse(reason)`` is
        called for each refused request."""
        self.name = name
        self.predict = predict
        self.max_batch_size = max_batch_size
        self.max_queue_rows = max_queue_rows
        self.max_queue_wait_ms = max_queue_wait_ms
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
        self.loop_lag_s = 0.0  # how late the event loop runs callbacks now (see _watch_loop)
        self._watched_at = 0.0
        self._watch: asyncio.TimerHandle | None = None
        self.on_batch = on_batch
        self.on_queue_change = on_queue_change
        self.on_refuse = on_refuse
        self.model_calls = 0
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._reserved = 0  # rows of admitted requests not queued yet (see Reservation)
        self._verdict: tuple[str, float, float] | None = None  # see refusal()
        self._unstarted: OrderedDict[Reservation, None] = OrderedDict()  # oldest first
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{name}")
        self._task: asyncio.Task[None] | None = None
        # the batch on the model now: its rows, when it started, its predicted time
        self._running_rows = 0
        self._running_since = 0.0
        self._running_predicted = 0.0

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._loop(), name=f"batcher-{self.name}")
        self._watched_at = due = loop.time() + LAG_TICK_S
        self._watch = loop.call_at(due, self._watch_loop, loop, due)

    def _watch_loop(self, loop: asyncio.AbstractEventLoop, scheduled: float) -> None:
        """Every ``LAG_TICK_S`` (``scheduled``: when this call was due): how late it ran is how
        long the event loop takes to get to anything now, a request just received included.
        Kept as a peak that halves every ``LAG_HALF_LIFE_S``, so one long loop iteration counts
        for a while."""
        now = loop.time()
        lag = max(0.0, now - scheduled)
        fade = 0.5 ** ((now - self._watched_at) / LAG_HALF_LIFE_S)
        self._watched_at = now
        self.loop_lag_s = max(lag, self.loop_lag_s * fade)
        self._verdict = None
        # every LAG_TICK_S while there is work; an idle model's loop is watched 20x less often
        busy = self._queue or self._reserved or self._running_rows
        tick = LAG_TICK_S if busy else LAG_TICK_S * 20
        self._watch = loop.call_at(now + tick, self._watch_loop, loop, now + tick)

    async def stop(self) -> None:
        """Stop the background task; queued requests fail with an error, never hang."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
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

    def timeout_s(self) -> float:
        """The batch timeout in force: the fixed one, or the one "auto" chose last."""
        return self.auto.timeout_s if self.auto is not None else self.batch_timeout_s

    def max_wait_s(self) -> float:
        """The longest expected wait admitted now, in seconds."""
        if self.max_queue_wait_ms is None:
            return math.inf
        if self.max_queue_wait_ms == "auto":
            model_batch = self.model_cost.predict(self.max_batch_size)
            return max(AUTO_WAIT_FLOOR_S, AUTO_WAIT_BATCHES * model_batch)
        return self.max_queue_wait_ms / 1000.0

    def expected_wait(self, rows: int = 1, now: float | None = None) -> tuple[float, float]:
        """(seconds until a new request of ``rows`` rows starts on the model, seconds its batch
        then takes), from the batch cost: the rest of the running batch, the queued rows cut
        into full batches, and the request's own batch (joined with the last partial one when
        it fits). A batch running past its predicted time is expected to run about as much
        longer again as it has overrun: a stuck model makes the wait grow."""
        size, cost = self.max_batch_size, self.cost
        now = time.monotonic() if now is None else now
        wait = self.loop_lag_s  # the event loop is this far behind
        if self._unstarted:  # ... or this far, with the requests it admitted
            wait = max(wait, now - next(iter(self._unstarted)).created)
        if self._running_rows:
            left = self._running_predicted - (now - self._running_since)
            wait += left if left >= 0.0 else -left
        full, partial = divmod(self._queued_rows + self._reserved, size)
        wait += full * cost.predict(size)
        if partial and partial + rows > size:
            wait += cost.predict(partial)
            own = rows
        else:
            own = partial + rows
        # A batch that is not full may also wait up to batch_timeout_ms for company; that is
        # left out: where admission matters (a long queue), batches fill.
        return wait, cost.predict(own)

    def refusal(
        self, rows: int, timeout_s: float, wait_bound: bool = True
    ) -> tuple[str, float, float] | None:
        """None when a request of ``rows`` rows with ``timeout_s`` left can expect to be
        served in time (see the module's docstring); else (reason, expected wait, the bound or
        deadline it exceeds), with the refusal counted. A few microseconds, no allocation on
        admission. ``wait_bound=False``: only the deadline and the row bound (a request
        admitted earlier keeps its place)."""
        verdict = self._verdict
        if verdict is not None and wait_bound:  # still over the bound: refused in a call
            return self._refused(*verdict)
        queued = self._queued_rows
        if queued == 0 and not self._reserved and not self._running_rows:
            return None  # an idle model always takes the request
        if queued and queued + rows > self.max_queue_rows:
            return self._refused("rows", 0.0, float(self.max_queue_rows))
        wait, own = self.expected_wait(rows)
        # A request that fits in the next batch is refused only for its deadline: nothing
        # could serve it sooner, and a closed loop of up to max_batch_size clients (a full
        # batch at most) is never refused, however slow the machine.
        if wait_bound and queued + self._reserved + rows > self.max_batch_size:
            bound = self.max_wait_s()
            if wait > bound:
                # Under overload most requests are refused this way: the verdict stands
                # until something can shorten the wait (a batch taken or done, a reservation
                # given back, the next lag tick, at most LAG_TICK_S), so that the next
                # thousands of refusals cost a dictionary lookup each.
                self._verdict = ("wait", wait, bound)
                return self._refused("wait", wait, bound)
        if wait + own > timeout_s:
            return self._refused("deadline", wait + own, timeout_s)
        return None

    def _refused(self, reason: str, wait: float, limit: float) -> tuple[str, float, float]:
        if self.on_refuse is not None:
            self.on_refuse(reason)
        return reason, wait, limit

    def admit(self, rows: int, timeout_s: float, wait_bound: bool = True) -> None:
        """Raise ``QueueFull`` (with a message saying why) when ``refusal`` refuses."""
        refused = self.refusal(rows, timeout_s, wait_bound)
        if refused is None:
            return
        reason, wait, limit = refused
        if reason == "rows":
            why = f"{self._queued_rows} rows queued (max_queue_rows={self.max_queue_rows})"
        elif reason == "wait":
            why = (
                f"expected wait {wait * 1000:.0f} ms is over max_queue_wait_ms "
                f"({limit * 1000:.0f} ms)"
            )
        else:
            why = (
                f"expected answer in {wait * 1000:.0f} ms, after the request's deadline of "
                f"{limit * 1000:.0f} ms"
            )
        raise QueueFull(
            f"model {self.name} is overloaded: {why}; retry later", retry_after(wait), reason
        )

    def reserve(self, rows: int = 1, started: bool = False) -> Reservation:
        """Hold ``rows`` rows for a request just admitted (see Reservation); ``started``: its
        handler runs already."""
        self._reserved += rows
        reservation = Reservation(self, rows, time.monotonic())
        if not started:
            self._unstarted[reservation] = None
        return reservation

    async def submit(
        self, rows: np.ndarray, timeout_s: float, reservation: Reservation | None = None
    ) -> Prediction:
        """Queue ``rows`` and wait for their outputs; raises QueueFull (at once, before any
        waiting) or DeadlineExceeded. ``reservation``, the request's place held since its
        admission, is given back first."""
        if reservation is not None:
            reservation.release()
        n = int(rows.shape[0])
        self.admit(n, timeout_s, wait_bound=reservation is None)
        now = time.monotonic()
        future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
        pending = _Pending(rows=rows, future=future, enqueued_at=now, deadline=now + timeout_s)
        self._queue.append(pending)
        self._queued_rows += n
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
        """Run ``fn`` on the model's thread, between batches (e.g. a weight swap)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def retry_after_s(self) -> int:
        """Seconds after which the queue has likely drained (at least 1)."""
        return max(1, math.ceil(self.expected_wait()[0]))

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
        """Run one batch; a successful one's time (call, hand-over and answers) feeds the cost."""
        rows = sum(p.size for p in batch)
        started = time.monotonic()
        self._running_rows, self._running_since = rows, started
        self._running_predicted = self.cost.predict(rows)
        try:
            ok = await self._run(batch)
        finally:
            self._running_rows = 0
            self._verdict = None
        if ok:
            self.cost.observe(rows, time.monotonic() - started)

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
        self._verdict = None

    async def _run(self, batch: list[_Pending]) -> bool:
        rows = batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch])
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            outputs, version = await loop.run_in_executor(self._executor, self._timed, rows)
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

    def _timed(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """The model call, on the model thread, timed there (``model_cost``, and by
        ``auto_clock`` for "auto")."""
        started, clock = time.monotonic(), self._auto_clock()
        result = self.predict(rows)
        self._model_seconds = time.monotonic() - started
        self._auto_seconds = self._auto_clock() - clock
        return result

    def _queue_changed(self) -> None:
        if self.on_queue_change is not None:
            self.on_queue_change(self._queued_rows)
