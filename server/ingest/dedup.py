"""De-duplication of sample messages by (``source``, ``seq``), with a gap counter.

Publishers that number their messages per source (``livefit publish`` does) let livefit drop a
message it already holds, which QoS 1 redelivery after a reconnect or a crash produces.

A publisher that starts again numbers from the start again. One that stamps each run with an
``epoch`` (``livefit publish`` does: a random 63-bit number per run) starts a numbering of its
own: the state is kept per (source, epoch), so a new run's messages are new, a late
redelivery of the old run's still a duplicate, and ``judge`` reports the new epoch as a
restart (``evidence="epoch"``). Without an epoch a restart cannot be told from a redelivery
for certain, and its messages are dropped as the duplicates they look like; ``judge`` reports a
suspected restart (``evidence="seq"``) when a duplicate's seq goes back to the source's first
number or more than ``max_out_of_order`` below its newest, once until that source sends a new
number again (a redelivery of a source's very first messages after a learner crash looks the
same, and is reported too).
Messages can also arrive out of order (a broker restart delivers its stored backlog while the
publisher resends what was in flight), so the state per source is not just the highest number
seen: it is a low-water mark ``low`` (every seq up to it held) plus the set of seqs held above
it. A message is a duplicate when its seq is at or below ``low`` or in that set. The set is
compacted as the gaps below it fill; when it grows past ``max_out_of_order`` the oldest gaps
are given up on and counted as gaps (messages never received).

Only messages that are durable (committed to the write-ahead log) advance the state, so a
message lost in a crash is never mistaken for a duplicate when the broker redelivers it. The
state is bounded (least recently seen sources are forgotten) and saved in checkpoints.

The same tracker makes loss visible when dedup is off (the ingest worker then ignores its
duplicate verdicts): ``missing`` is how many numbers below the newest one received per source
have not arrived (yet), and ``commit`` returns the gaps given up on. A broker that drops
messages (Debian's mosquitto keeps at most 1,000 queued per client by default) shows up there.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

_Key = tuple[str, int | None]  # (source, epoch)


@dataclass(frozen=True, slots=True)
class Restart:
    """A publisher that numbers from the start again: by a new ``epoch`` (certain), or
    suspected from a ``seq`` that went back (``newest``: the highest held before)."""

    evidence: Literal["epoch", "seq"]
    source: str
    seq: int
    epoch: int | None
    newest: int | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``judge`` found: a duplicate to drop (with dedup on), and a restart to report."""

    duplicate: bool
    restart: Restart | None = None


@dataclass
class _Source:
    low: int | None = None  # every seq <= low is held (None: not known yet)
    above: set[int] = field(default_factory=set)  # seqs held above low
    newest: int | None = None  # highest seq held
    first: int | None = None  # the first seq held (None: not known, as in old saved states)
    suspected: bool = False  # a suspected restart was reported; a new seq clears it

    @property
    def missing(self) -> int:
        """Numbers between ``low`` and the newest seq held that are not held."""
        if not self.above or self.low is None or self.newest is None:
            return 0
        return self.newest - self.low - len(self.above)

    def holds(self, seq: int) -> bool:
        return (self.low is not None and seq <= self.low) or seq in self.above

    def add(self, seq: int, max_out_of_order: int) -> int:
        """Hold ``seq``; returns how many missing seqs were given up on as gaps."""
        self.above.add(seq)
        self.newest = seq if self.newest is None else max(self.newest, seq)
        self.suspected = False
        if self.low is None and len(self.above) == 1:
            self.low = seq - 1
            self.first = seq
        gaps = 0
        if len(self.above) > max_out_of_order:
            lowest = min(self.above)
            assert self.low is not None
            gaps = max(0, lowest - self.low - 1)
            self.low = lowest - 1
        assert self.low is not None
        while self.low + 1 in self.above:
            self.low += 1
            self.above.discard(self.low)
        return gaps


class SequenceTracker:
    """Which (source, epoch, seq) numbers are durably held; ``max_sources`` (source, epoch)
    pairs remembered."""

    def __init__(self, max_sources: int = 100_000, max_out_of_order: int = 4096) -> None:
        self.max_sources = max_sources
        self.max_out_of_order = max_out_of_order
        self._held: OrderedDict[_Key, _Source] = OrderedDict()
        self._pending: dict[_Key, set[int]] = {}
        self._epochs: OrderedDict[str, int | None] = OrderedDict()  # each source's newest epoch
        self._lock = threading.Lock()
        self.missing = 0  # sum of every remembered source's missing numbers

    def check(self, source: str, seq: int, epoch: int | None = None) -> bool:
        """True if (source, epoch, seq) is already held or pending: a duplicate. Else mark it
        pending."""
        return self.judge(source, seq, epoch).duplicate

    def judge(self, source: str, seq: int, epoch: int | None = None) -> Verdict:
        """``check``, and whether the message shows its publisher restarted its numbering."""
        key = (source, epoch)
        with self._lock:
            state = self._held.get(key)
            pending = self._pending.get(key)
            if (state is not None and state.holds(seq)) or (pending and seq in pending):
                return Verdict(True, self._suspected(source, seq, epoch, state))
            restart = None
            if state is None and pending is None and self._epochs.get(source, epoch) != epoch:
                restart = Restart("epoch", source, seq, epoch, None)
            self._pending.setdefault(key, set()).add(seq)
            return Verdict(False, restart)

    def _suspected(
        self, source: str, seq: int, epoch: int | None, state: _Source | None
    ) -> Restart | None:
        if state is None or state.suspected or state.newest is None:
            return None
        back_to_first = state.first is not None and seq <= state.first
        if not back_to_first and state.newest - seq <= self.max_out_of_order:
            return None
        state.suspected = True
        return Restart("seq", source, seq, epoch, state.newest)

    def commit(self) -> int:
        """The pending messages are durable now: hold them. Returns gaps given up on."""
        gaps = 0
        with self._lock:
            for key, seqs in self._pending.items():
                if key not in self._held:
                    self._epochs[key[0]] = key[1]
                    self._epochs.move_to_end(key[0])
                state = self._held.setdefault(key, _Source())
                before = state.missing
                for seq in sorted(seqs):
                    gaps += state.add(seq, self.max_out_of_order)
                self.missing += state.missing - before
                self._held.move_to_end(key)
            self._pending.clear()
            while len(self._held) > self.max_sources:
                _, forgotten = self._held.popitem(last=False)
                self.missing -= forgotten.missing
            while len(self._epochs) > self.max_sources:
                self._epochs.popitem(last=False)
        return gaps

    def discard_pending(self) -> None:
        with self._lock:
            self._pending.clear()

    def dumps(self) -> str:
        """The durable state as JSON (for checkpoints), least recently used first."""
        with self._lock:
            held = [[s, e, v.low, sorted(v.above), v.first] for (s, e), v in self._held.items()]
        return json.dumps({"sources": held})

    def loads(self, text: str) -> None:
        """Replace the state with a saved one (from a checkpoint; also the format before epochs:
        ``{source: [low, above]}``)."""
        saved = json.loads(text)
        if "sources" in saved and isinstance(saved["sources"], list):
            entries = [
                (str(s), e, low, above, first) for s, e, low, above, first in saved["sources"]
            ]
        else:
            entries = [(str(s), None, low, above, None) for s, (low, above) in saved.items()]
        with self._lock:
            self._held.clear()
            self._epochs.clear()
            for source, epoch, low, above, first in entries:
                newest = max(above, default=low)
                self._held[(source, epoch)] = _Source(low, set(above), newest, first)
                self._epochs[source] = epoch
                self._epochs.move_to_end(source)
            self.missing = sum(state.missing for state in self._held.values())
