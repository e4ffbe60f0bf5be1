"""The batch cost model: the time of a batch cycle fitted online (``BatchCost``), the rate rows
arrive at (``ArrivalRate``) and the "auto" batch timeout chosen from both (``AutoTimeout``).

This module owns the estimates; the batcher (``batcher``) feeds them measured batches and
arrivals, and admission (``admission``) reads the cost to predict a request's wait. Pure
arithmetic: no asyncio, no threads.
"""

from __future__ import annotations

import math


class BatchCost:
    """The time of one batch cycle as a function of its rows: ``per_row * rows + per_batch``.

    Fitted online by exponentially weighted least squares over the last ``memory`` batches
    (older ones fade), so it follows the machine as it gets busier or quieter. A batch cycle
    is measured from the model call's start to the batcher being ready for the next one, so it
    includes handing the batch to the model thread and back, and with it the event loop's work
    meanwhile; for a model called on the loop, the call and then the answered handlers' run
    (writing their responses, the loop's real per-batch cost), which the batcher yields to
    after answering. Two prior points (one row and ``prior_rows`` rows, from the warm-up
    timings when known) keep a small constant weight: when every batch has the same size (a
    saturated server), the slope stays defined and the prediction for that size is still
    exactly what was measured. Neither term goes negative.
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
