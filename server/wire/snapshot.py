"""Snapshots: the unit that leaves the trainer (serving swap, weight publish, checkpoint).

The trainer is the only writer. ``SnapshotSlot.latest`` is replaced by one reference assignment,
so a reader always sees a whole snapshot, never a half-written one.

A snapshot's ``version`` counts training steps within its ``lineage`` (a random id made with the
learner's checkpoint directory): versions are comparable only within one lineage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent copy of a model's weights at one version (training steps so far)."""

    model: str
    version: int
    weights: tuple[np.ndarray, ...]
    created_at: float  # time.time() when the copy was taken
    samples_seen: int  # samples trained into this lineage of weights
    newest_published_at: float | None = None  # newest sample "ts" trained into these weights
    metadata: dict[str, str] = field(default_factory=dict)
    lineage: str = ""  # the history ``version`` counts in

    def newer_than(self, other: Snapshot | None) -> bool:
        """True when this snapshot should replace ``other``: a later version of the same
        lineage, or any snapshot of another lineage (receivers decide which lineage wins)."""
        if other is None:
            return True
        return self.lineage != other.lineage or self.version > other.version


Listener = Callable[[Snapshot], None]


class SnapshotSlot:
    """Holds the newest snapshot of one model and tells listeners when a new one arrives."""

    def __init__(self) -> None:
        self._latest: Snapshot | None = None
        self._listeners: list[Listener] = []
        self._changed = threading.Condition()

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(snapshot)`` on every new snapshot; it must return quickly."""
        self._listeners.append(listener)

    def publish(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` the newest (versions only move forward within a lineage) and
        notify listeners."""
        current = self._latest
        if (
            current is not None
            and snapshot.lineage == current.lineage
            and snapshot.version < current.version
        ):
            raise ValueError(f"version went backwards: {snapshot.version} < {current.version}")
        with self._changed:
            self._latest = snapshot
            self._changed.notify_all()
        for listener in list(self._listeners):
            try:
                listener(snapshot)
            except Exception:
                log.exception(
                    "snapshot listener failed for %s v%d", snapshot.model, snapshot.version
                )

    def wait_for(self, version: int, timeout: float) -> Snapshot | None:
        """Block until a snapshot at ``version`` or newer exists; None on timeout."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._latest is not None and self._latest.version >= version, timeout
            )
            return self._latest if self._latest and self._latest.version >= version else None
