"""De-duplication of sample messages by (``source``, ``seq``), with a gap counter.

Publishers that number their messages per source (``livefit publish`` does) let livefit drop a
message it already holds, which QoS 1 redelivery after a reconnect or a crash produces.
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


@dataclass
class _Source:
    low: int | None = None  # every seq <= low is held (None: not known yet)
    above: set[int] = field(default_factory=set)  # seqs held above low
    newest: int | None = None  # highest seq held

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
        if self.low is None and len(self.above) == 1:
            self.low = seq - 1
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
    """Which (source, seq) pairs are durably held; ``max_sources`` sources remembered."""

    def __init__(self, max_sources: int = 100_000, max_out_of_order: int = 4096) -> None:
        self.max_sources = max_sources
        self.max_out_of_order = max_out_of_order
        self._held: OrderedDict[str, _Source] = OrderedDict()
        self._pending: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self.missing = 0  # sum of every remembered source's missing numbers

    def check(self, source: str, seq: int) -> bool:
        """True if (source, seq) is already held or pending: a duplicate. Else mark it pending."""
        with self._lock:
            state = self._held.get(source)
            pending = self._pending.setdefault(source, set())
            if (state is not None and state.holds(seq)) or seq in pending:
                return True
            pending.add(seq)
            return False

    def commit(self) -> int:
        """The pending messages are durable now: hold them. Returns gaps given up on."""
        gaps = 0
        with self._lock:
            for source, seqs in self._pending.items():
                state = self._held.setdefault(source, _Source())
                before = state.missing
                for seq in sorted(seqs):
                    gaps += state.add(seq, self.max_out_of_order)
                self.missing += state.missing - before
                self._held.move_to_end(source)
            self._pending.clear()
            while len(self._held) > self.max_sources:
                _, forgotten = self._held.popitem(last=False)
                self.missing -= forgotten.missing
        return gaps

    def discard_pending(self) -> None:
        with self._lock:
            self._pending.clear()

    def dumps(self) -> str:
        """The durable state as JSON (for checkpoints)."""
        with self._lock:
            return json.dumps({s: [v.low, sorted(v.above)] for s, v in self._held.items()})

    def loads(self, text: str) -> None:
        """Replace the state with a saved one (from a checkpoint)."""
        with self._lock:
            self._held.clear()
            for source, (low, above) in json.loads(text).items():
                self._held[str(source)] = _Source(low, set(above), max(above, default=low))
            self.missing = sum(state.missing for state in self._held.values())
