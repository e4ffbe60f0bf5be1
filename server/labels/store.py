"""The join of predictions and their delayed labels: a deterministic state machine.

A ``JoinStore`` holds, by id, the predictions still waiting for a label (``pending``) and the
labels that arrived before their prediction record (``early``). It is driven only by events
in write-ahead-log order (prediction records, labels, expiry ticks), each with its log position
and the time the log holds for it (the learner's arrival time, ``joiner``'s steady clock), never
by the clock it runs at: replaying the same events from the same saved state gives the same
joins, expiries and samples. Its own time (``now``) is the newest event time applied: an event
stamped earlier counts as arriving then, so times never go back in log order. It has no thread
and no lock; the ingest worker is its only caller (``joiner``).

- A label meets its prediction: one training sample (the recorded inputs, the label's ``y`` and
  ``w``), outcome ``joined``. The pair is scored as it was served (``score``).
- A label whose prediction record has not arrived waits in ``early`` under the same limits.
- An id joins at most once: joined and expired ids are remembered (the newest
  ``max(2 * max_pending, 1000)``); a later label for them is ``duplicate`` (joined) or
  ``late`` (expired), and a repeated prediction record (QoS 1 redelivery) is ignored.
- Expiry, by count: inserting beyond ``max_pending`` expires the oldest (insertion order). By
  time: a tick at time ``now`` expires pending predictions whose record arrived at or before
  ``now - ttl_s`` and early labels received then, oldest first. Arrival times are the
  learner's own and rise in log order, so insertion order is time order and nothing waits
  behind another: the serving time a record carries (another process's clock, which may be
  wrong or lie) decides no expiry; it only dates the label delay, clamped to the arrival time.
  An expired prediction is dropped or, with ``on_expiry = "default"``, learned with
  ``default_y``; an expired early label is ``unknown_id``.

Samples carry the position of the event that produced them, and the store remembers the ones
produced after ``trained`` (``unsent``) so a checkpoint can save them with the state: replaying
the log from the checkpoint's position then re-queues them instead of losing them.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack
import numpy as np

from ..base.clocks import ahead_s
from ..wire.label_ids import RowId, key_of
from ..wire.labels import LabelBatch, PredictionBatch
from ..wire.samples import SampleChunk

OUTCOMES = ("joined", "expired", "unknown_id", "duplicate", "late", "rejected")


@dataclass(frozen=True, slots=True)
class Shapes:
    input: tuple[int, ...]
    output: tuple[int, ...]
    target: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Policy:
    ttl_s: float
    max_pending: int
    on_expiry: Literal["drop", "default"] = "drop"
    default_y: np.ndarray | None = None  # target-shaped, with on_expiry = "default"


@dataclass(slots=True)
class _Pending:
    id: RowId
    x: np.ndarray
    p: np.ndarray
    version: int
    t: float  # served, by the serving process's clock (at most ``arrived``)
    arrived: float  # at the learner, by its clock: what the TTL counts from


@dataclass(slots=True)
class _Early:
    id: RowId
    y: np.ndarray
    w: float
    ts: float | None
    received_at: float


@dataclass(slots=True)
class Applied:
    """What one event did: outcome counts, the served pairs it joined, and its samples."""

    outcomes: Counter[str] = field(default_factory=Counter)
    served: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (p, y)
    delays: list[float] = field(default_factory=list)  # label time - prediction time
    ahead: list[float] = field(default_factory=list)  # seconds records' times were ahead
    chunk: SampleChunk | None = None


class JoinStore:
    """Pending predictions and early labels of one model, joined by id."""

    def __init__(self, shapes: Shapes, policy: Policy) -> None:
        self.shapes = shapes
        self.policy = policy
        self.pending: OrderedDict[str, _Pending] = OrderedDict()
        self.early: OrderedDict[str, _Early] = OrderedDict()
        self.done: OrderedDict[str, bool] = OrderedDict()  # key -> joined (else expired)
        self.applied = 0  # log position of the last event applied
        self.now = 0.0  # the newest event time applied (never goes back)
        self.unsent: deque[SampleChunk] = deque()  # samples made, maybe not trained yet
        self._rows: list[tuple[np.ndarray, np.ndarray, float]] = []  # the event's samples

    # events ------------------------------------------------------------------------------------
    def add_predictions(self, batch: PredictionBatch, arrived: float, position: int) -> Applied:
        result = Applied()
        arrived = self._advance(arrived)
        for i, row_id in enumerate(batch.ids):
            key = key_of(row_id)
            if key in self.pending or key in self.done:
                continue  # a record delivered twice
            early = self.early.pop(key, None)
            ahead = ahead_s(batch.t[i], arrived)
            if ahead:
                result.ahead.append(ahead)
            served = min(batch.t[i], arrived)
            record = _Pending(row_id, batch.x[i], batch.p[i], batch.version[i], served, arrived)
            if early is not None:
                self._join(key, record, early, result)
                continue
            self.pending[key] = record
            while len(self.pending) > self.policy.max_pending:
                self._expire_prediction(*self.pending.popitem(last=False), result)
        return self._finish(result, position, None)

    def add_labels(self, batch: LabelBatch, received_at: float, position: int) -> Applied:
        result = Applied()
        received_at = self._advance(received_at)
        for i, row_id in enumerate(batch.ids):
            key = key_of(row_id)
            label = _Early(row_id, batch.y[i], float(batch.w[i]), batch.ts, received_at)
            if key in self.done:
                result.outcomes["duplicate" if self.done[key] else "late"] += 1
            elif key in self.early:
                result.outcomes["duplicate"] += 1
            elif key in self.pending:
                self._join(key, self.pending.pop(key), label, result)
            else:
                self.early[key] = label
                while len(self.early) > self.policy.max_pending:
                    self.early.popitem(last=False)
                    result.outcomes["unknown_id"] += 1
        return self._finish(result, position, batch.ts)

    def tick(self, now: float, position: int) -> Applied:
        """Expire what is older than ``ttl_s`` at ``now`` (a logged time)."""
        result = Applied()
        horizon = self._advance(now) - self.policy.ttl_s
        while self.pending and next(iter(self.pending.values())).arrived <= horizon:
            self._expire_prediction(*self.pending.popitem(last=False), result)
        while self.early and next(iter(self.early.values())).received_at <= horizon:
            self.early.popitem(last=False)
            result.outcomes["unknown_id"] += 1
        return self._finish(result, position, None)

    def due(self, now: float) -> bool:
        """True when a tick at ``now`` would expire something."""
        horizon = max(now, self.now) - self.policy.ttl_s
        return bool(
            (self.pending and next(iter(self.pending.values())).arrived <= horizon)
            or (self.early and next(iter(self.early.values())).received_at <= horizon)
        )

    def trained_through(self, position: int) -> None:
        """The trainer has trained every sample up to ``position``: forget those."""
        while self.unsent and (self.unsent[0].position or 0) <= position:
            self.unsent.popleft()

    # internals ---------------------------------------------------------------------------------
    def _advance(self, t: float) -> float:
        """The store's time at an event stamped ``t``: ``t``, or ``now`` if that is later."""
        self.now = max(self.now, t)
        return self.now

    def _join(self, key: str, record: _Pending, label: _Early, result: Applied) -> None:
        self._remember(key, joined=True)
        self._rows.append((record.x, label.y, label.w))
        result.outcomes["joined"] += 1
        result.served.append((record.p, label.y))
        result.delays.append(max(0.0, (label.ts or label.received_at) - record.t))

    def _expire_prediction(self, key: str, record: _Pending, result: Applied) -> None:
        self._remember(key, joined=False)
        result.outcomes["expired"] += 1
        if self.policy.on_expiry == "default" and self.policy.default_y is not None:
            self._rows.append((record.x, self.policy.default_y, 1.0))

    def _remember(self, key: str, joined: bool) -> None:
        self.done[key] = joined
        while len(self.done) > max(2 * self.policy.max_pending, 1000):
            self.done.popitem(last=False)

    def _finish(self, result: Applied, position: int, ts: float | None) -> Applied:
        self.applied = max(self.applied, position)
        if self._rows:
            rows, self._rows = self._rows, []
            result.chunk = SampleChunk(
                x=np.stack([r[0] for r in rows]).astype(np.float32),
                y=np.stack([r[1] for r in rows]).astype(np.float32),
                w=np.array([r[2] for r in rows], dtype=np.float32),
                published_at=ts,
                position=position or None,
                joined=True,
            )
            if position:
                self.unsent.append(result.chunk)
        return result

    # saved state -------------------------------------------------------------------------------
    def dumps(self) -> bytes:
        """The whole state as msgpack (for a checkpoint)."""

        def blob(arrays: list[np.ndarray]) -> bytes:
            return np.asarray(arrays, dtype="<f4").tobytes() if arrays else b""

        pending = list(self.pending.values())
        early = list(self.early.values())
        unsent = [
            [c.position, blob(list(c.x)), blob(list(c.y)), blob(list(c.w)), c.published_at]
            for c in self.unsent
        ]
        state: dict[str, Any] = {
            "applied": self.applied,
            "now": self.now,
            "pending": [[r.id, r.version, r.t, r.arrived] for r in pending],
            "pending_x": blob([r.x for r in pending]),
            "pending_p": blob([r.p for r in pending]),
            "early": [[r.id, r.w, r.ts, r.received_at] for r in early],
            "early_y": blob([r.y for r in early]),
            "done": [[k, v] for k, v in self.done.items()],
            "unsent": unsent,
        }
        return msgpack.packb(state, use_bin_type=True)

    def loads(self, data: bytes) -> None:
        """Replace the state with one ``dumps`` made (under the same shapes)."""
        state = msgpack.unpackb(data, raw=False, strict_map_key=False)
        s = self.shapes
        xs = _rows(state["pending_x"], s.input)
        ps = _rows(state["pending_p"], s.output)
        self.pending = OrderedDict(
            (key_of(row[0]), _Pending(row[0], xs[n], ps[n], row[1], *_times(row)))
            for n, row in enumerate(state["pending"])
        )
        ys = _rows(state["early_y"], s.target)
        self.early = OrderedDict(
            (key_of(i), _Early(i, ys[n], w, ts, r))
            for n, (i, w, ts, r) in enumerate(state["early"])
        )
        self.done = OrderedDict((k, bool(v)) for k, v in state["done"])
        self.applied = int(state["applied"])
        self.now = float(state.get("now", 0.0))
        self.unsent = deque(
            SampleChunk(
                _rows(x, s.input), _rows(y, s.target), _rows(w, ()), published, 0.0, pos, True
            )
            for pos, x, y, w, published in state["unsent"]
        )


def _times(row: list[Any]) -> tuple[float, float]:
    """(served, arrived) of a saved pending row. A state saved before arrival times were kept
    has the serving time only: it stands for the arrival, but never later than now."""
    if len(row) > 3:
        return float(row[2]), float(row[3])
    served = min(float(row[2]), time.time())
    return served, served


def _rows(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4").reshape((-1, *shape)).copy()
