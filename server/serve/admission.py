"""Admission by expected wait: the ``AdmissionControl`` each ``RequestBatcher`` owns
(``batcher.admission``).

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

This module owns that decision and what feeds it: the wait estimate, the refusal and its
reasons (``QueueFull``), the places admitted requests hold (``Reservation``), the running
batch's expected end and the event loop's measured lag. The queue and the model calls are
``batcher``'s: it tells its ``AdmissionControl`` when a batch starts and ends and when the
queue shrinks, and lets it read how many rows are queued. The batch cost is ``batch_cost``'s.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from .batch_cost import BatchCost

AUTO_WAIT_BATCHES = 2.0  # max_queue_wait "auto": this many full-batch model calls ...
AUTO_WAIT_FLOOR_S = 0.05  # ... but at least this: one batch cycle of HTTP work at capacity
LAG_TICK_S = 0.005  # how often the event loop's lag is measured
LAG_HALF_LIFE_S = 0.01  # a lag peak halves every 10 ms
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

    __slots__ = ("_admission", "created", "rows")

    def __init__(self, admission: AdmissionControl, rows: int, created: float) -> None:
        self._admission: AdmissionControl | None = admission
        self.rows = rows
        self.created = created

    def start(self) -> None:
        """The request's handler runs: the event loop has reached it."""
        if self._admission is not None:
            self._admission.reservation_started(self)

    def release(self) -> None:
        """Give the place back (the request is queued, refused or gone); once only."""
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.reservation_released(self)


class AdmissionControl:
    """Whether a model's batcher can take one more request in time (see the module's
    docstring). Owned by a ``RequestBatcher``, which reports its batches and queue to it
    (``batch_started``, ``batch_done``, ``queue_shrank``, the ``queued_rows`` it reads); the
    HTTP side asks it (``refusal``, ``admit``) and holds places with it (``reserve``)."""

    def __init__(
        self,
        name: str,
        max_batch_size: int,
        cost: BatchCost,
        model_cost: BatchCost,
        queued_rows: Callable[[], int],
        max_queue_rows: int,
        max_queue_wait_ms: float | Literal["auto"] | None,
        on_refuse: Callable[[str], None] | None = None,
    ) -> None:
        """``cost``: the batch cycle's cost (the expected wait); ``model_cost``: the model
        call's alone (the "auto" wait bound); ``queued_rows()``: rows in the batcher's queue.
        ``on_refuse(reason)`` is called for each refused request."""
        self.name = name
        self.max_batch_size = max_batch_size
        self.cost = cost
        self.model_cost = model_cost
        self._queued_rows = queued_rows
        self.max_queue_rows = max_queue_rows
        self.max_queue_wait_ms = max_queue_wait_ms
        self.on_refuse = on_refuse
        self.loop_lag_s = 0.0  # how late the event loop runs callbacks now (see _watch_loop)
        self._watched_at = 0.0
        self._watch: asyncio.TimerHandle | None = None
        self._reserved = 0  # rows of admitted requests not queued yet (see Reservation)
        self._verdict: tuple[str, float, float] | None = None  # see refusal()
        self._unstarted: OrderedDict[Reservation, None] = OrderedDict()  # oldest first
        # the batch on the model now: its rows, when it started, its predicted time
        self._running_rows = 0
        self._running_since = 0.0
        self._running_predicted = 0.0

    @property
    def reserved_rows(self) -> int:
        """Rows of admitted requests that hold a place and are not queued yet."""
        return self._reserved

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start watching ``loop``'s lag (see ``_watch_loop``)."""
        self._watched_at = due = loop.time() + LAG_TICK_S
        self._watch = loop.call_at(due, self._watch_loop, loop, due)

    def stop(self) -> None:
        """Stop watching the event loop's lag."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def batch_started(self, rows: int, now: float) -> None:
        """A batch of ``rows`` rows went to the model at ``now``: its predicted time counts
        in the expected wait until ``batch_done``."""
        self._running_rows, self._running_since = rows, now
        self._running_predicted = self.cost.predict(rows)

    def batch_done(self) -> None:
        """The running batch ended (answered or failed): the wait may be shorter now."""
        self._running_rows = 0
        self._verdict = None

    def queue_shrank(self) -> None:
        """A request left the batcher's queue: the wait may be shorter now."""
        self._verdict = None

    def reservation_started(self, reservation: Reservation) -> None:
        """``reservation``'s handler runs (``Reservation.start``): its age no longer says how
        far behind the event loop is."""
        self._unstarted.pop(reservation, None)
        self._verdict = None

    def reservation_released(self, reservation: Reservation) -> None:
        """``reservation``'s place is given back (``Reservation.release``, once)."""
        self._unstarted.pop(reservation, None)
        self._reserved -= reservation.rows
        self._verdict = None

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
        busy = self._queued_rows() or self._reserved or self._running_rows
        tick = LAG_TICK_S if busy else LAG_TICK_S * 20
        self._watch = loop.call_at(now + tick, self._watch_loop, loop, now + tick)

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
        full, partial = divmod(self._queued_rows() + self._reserved, size)
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
        queued = self._queued_rows()
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
            why = f"{self._queued_rows()} rows queued (max_queue_rows={self.max_queue_rows})"
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
