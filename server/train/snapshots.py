"""A trainer's snapshots (``Snapshots``): the copies of its weights that everything downstream
reads.

Every ``weights.serve_interval_s`` (and only when the version moved) the served weights are
copied into a ``Snapshot`` published into the slot: the learner's own serving swaps each one in,
the weight topic's publisher sends at most one per ``publish_interval_s`` (the newest). The
interval stretches to ``_COPY_SHARE`` times what the copy took, so copying a large model never
takes more than about 5 % of the trainer's time; the first version trained after a start goes out
at once (the start's own snapshot, of the restored or initial weights, opens no interval).
A snapshot carries the served candidate's weights with online model selection, the averaged ones
(what was scored) with ``train.weight_average``. One whose version the ``VersionMark`` does not
cover is held back (serving and replicas keep the last one handed out) until the mark is written.
"""

from __future__ import annotations

import math
import time

from ..config.model import ModelSettings
from ..wire.snapshot import Snapshot, SnapshotSlot
from .accounting import Progress
from .selection import CandidateSet
from .train_step import TrainStep
from .version_mark import VersionMark

_COPY_SHARE = 20.0  # a snapshot interval is at least this many times the copy it costs


class Snapshots:
    """Snapshots of model ``name`` at its ``progress``, from ``step`` (or the served one of
    ``candidates``), into ``slot`` once ``mark`` covers their version."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        progress: Progress,
        step: TrainStep,
        candidates: CandidateSet | None,
        slot: SnapshotSlot,
        mark: VersionMark,
    ) -> None:
        self.name = name
        self.settings = settings
        self.progress = progress
        self.step = step
        self.candidates = candidates
        self.slot = slot
        self.mark = mark
        self._last_at = 0.0  # monotonic time of the last snapshot taken
        self._version = -1  # the last snapshot's version
        self._last: Snapshot | None = None
        self.held: Snapshot | None = None  # the newest snapshot not handed out yet (_hand_out)
        self._copy_s = 0.0  # what the last snapshot's copy of the weights took

    def take_first(self) -> None:
        """The start's snapshot (restored or initial weights), which opens no interval: the
        first version trained goes out at once."""
        self.take(force=True)
        self._last_at = -math.inf

    def due(self) -> bool:
        """Whether ``take`` would copy the weights now: the version moved and the interval is
        over."""
        interval = max(self.settings.weights.serve_interval_s, _COPY_SHARE * self._copy_s)
        return (
            self.progress.version != self._version and time.monotonic() - self._last_at >= interval
        )

    def take(self, force: bool = False) -> Snapshot | None:
        """Hand a copy of the weights to the slot, at most every ``serve_interval_s``
        (stretched to ``_COPY_SHARE`` times the copy's cost) unless ``force``; returns the
        snapshot at the current version, or None when none was due."""
        self.hand_out_held()
        progress = self.progress
        now = time.monotonic()
        interval = max(self.settings.weights.serve_interval_s, _COPY_SHARE * self._copy_s)
        if progress.version == self._version:
            return self._last
        if not force and now - self._last_at < interval:
            return None
        started = time.perf_counter()
        snapshot = Snapshot(
            model=self.name,
            version=progress.version,
            weights=tuple(self.served_step().served_weights()),
            created_at=time.time(),
            samples_seen=progress.samples_seen,
            newest_published_at=progress.newest_published_at,
            lineage=progress.lineage,
        )
        self._copy_s = time.perf_counter() - started
        self._last_at = now
        self._version = progress.version
        self._last = snapshot
        self._hand_out(snapshot)
        return snapshot

    def hand_out_held(self) -> None:
        """Try again to hand out the snapshot held back, if any (``_hand_out``)."""
        if self.held is not None:
            self._hand_out(self.held)

    def served_step(self) -> TrainStep:
        """The step whose model snapshots carry: the served candidate's (the configured one
        without selection); its averaged weights with ``train.weight_average``."""
        return self.step if self.candidates is None else self.candidates.served.policy.step

    def _hand_out(self, snapshot: Snapshot) -> None:
        """Publish ``snapshot`` into the slot if its version is claimed on disk
        (``VersionMark.claim``); else hold it back (the newest held wins) for ``take`` to try
        again."""
        if self.mark.claim(snapshot.version):
            self.held = None
            self.slot.publish(snapshot)
        else:
            self.held = snapshot
