"""The past versions a model's serving keeps (``KeptVersions``), for the versioned prediction
paths: the newest snapshots handed to serving, within a count and a byte budget (the newest
always), and the learner's checkpoints on disk, read when first asked for (``CheckpointShelf``).

A version is kept only in the lineage being served: a snapshot of another lineage empties the
store, and a checkpoint is served only when its lineage is the one served, so a ``versions/N``
never answers with another history's version N. What a kept version computes is what it served
when it was current: a snapshot carries the served weights, a checkpoint records them
(``Checkpoint.served_weights``; one written before that was recorded is not served).

``add`` is a snapshot slot's listener (any thread); ``get`` and ``versions`` are cheap and may
run on the event loop; ``load`` may read a checkpoint from disk and belongs off the loop
(``asyncio.to_thread``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..config.model_tables import VersionsSettings
from ..storage.checkpoint import (
    CheckpointError,
    checkpoint_path,
    checkpoint_versions,
    read_checkpoint,
    read_lineage,
)
from ..wire.snapshot import Snapshot

log = logging.getLogger(__name__)
SHOWN_VERSIONS = 12  # versions a 404 names one by one; more are summarised
CHECKPOINTS_CACHED = 2  # checkpoints read from disk and held: a client asks for one many times


class VersionNotKept(LookupError):
    """A version this server does not keep (expired or never made): HTTP 404, naming the kept."""


@dataclass(frozen=True, slots=True)
class KeptList:
    """The versions kept now, each newest first: snapshots in memory, checkpoints on disk."""

    snapshots: tuple[int, ...]
    checkpoints: tuple[int, ...]

    def all(self) -> list[int]:
        """Every kept version, newest first, each once."""
        return sorted(set(self.snapshots) | set(self.checkpoints), reverse=True)

    def describe(self) -> str:
        """The kept versions for a message: consecutive runs as ranges, at most
        ``SHOWN_VERSIONS`` parts of each kind, the rest counted."""
        parts = []
        if self.snapshots:
            parts.append(f"{_compact(self.snapshots)} (recent snapshots)")
        if self.checkpoints:
            parts.append(f"{_compact(self.checkpoints)} (checkpoints)")
        return "; ".join(parts) or "none yet"


def _compact(versions: Iterable[int]) -> str:
    """``[9, 8, 7, 5, 1]`` as "1, 5, 7-9": ascending, runs as ranges; past ``SHOWN_VERSIONS``
    runs, the oldest few and the newest few with the count between."""
    ordered = sorted(set(versions))
    runs: list[tuple[int, int]] = []
    for v in ordered:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(shown) > SHOWN_VERSIONS:
        half = SHOWN_VERSIONS // 2
        hidden = len(shown) - 2 * half
        shown = [*shown[:half], f"... {hidden} more ...", *shown[-half:]]
    return ", ".join(shown)


class CheckpointShelf:
    """The checkpoints of one model in ``directory`` (the learner's), read on demand and never
    written: served by version while their files are there (``checkpoint.keep`` newest)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: OrderedDict[tuple[str, int], Snapshot] = OrderedDict()
        self._lock = threading.Lock()  # one read at a time: the second asker finds it cached

    def versions(self, lineage: str) -> list[int]:
        """The checkpoint versions on disk when the directory's lineage is ``lineage``."""
        if not lineage or read_lineage(self.directory) != lineage:
            return []
        return checkpoint_versions(self.directory)

    def cached(self, version: int, lineage: str) -> Snapshot | None:
        """Checkpoint ``version`` of ``lineage`` if it was read before and its file is still
        there (a pruned checkpoint is no longer kept, whatever this cache holds)."""
        with self._lock:
            found = self._cache.get((lineage, version))
        if found is None or not checkpoint_path(self.directory, version).exists():
            return None
        return found

    def load(self, name: str, version: int, lineage: str) -> Snapshot | None:
        """Checkpoint ``version`` of ``lineage`` as a snapshot of its served weights; None when
        it is not on disk, unreadable, of another lineage, or holds no served weights."""
        with self._lock:
            if version not in self.versions(lineage):
                return None
            cached = self._cache.get((lineage, version))
            if cached is not None:
                self._cache.move_to_end((lineage, version))
                return cached
            try:
                checkpoint = read_checkpoint(checkpoint_path(self.directory, version))
            except CheckpointError as exc:  # pruned meanwhile, or damaged: not served
                log.info("checkpoint v%d of %s not served: %s", version, name, exc)
                return None
            served = checkpoint.served_weights
            if served is None or checkpoint.lineage not in ("", lineage):
                return None
            snapshot = Snapshot(
                model=name,
                version=checkpoint.version,
                weights=tuple(served),
                created_at=checkpoint.created_at,
                samples_seen=checkpoint.samples_seen,
                lineage=lineage,
            )
            self._cache[(lineage, version)] = snapshot
            while len(self._cache) > CHECKPOINTS_CACHED:
                self._cache.popitem(last=False)
            return snapshot


class KeptVersions:
    """The versions of model ``name`` its serving answers by number: the snapshots ``add`` was
    given (the newest ``settings.keep_snapshots`` within ``settings.keep_bytes``; the newest
    always), the current one from ``latest``, and the checkpoints of ``shelf`` (if any)."""

    def __init__(
        self,
        name: str,
        settings: VersionsSettings,
        latest: Callable[[], Snapshot | None],
        shelf: CheckpointShelf | None = None,
    ) -> None:
        self.name = name
        self.keep = settings.keep_snapshots
        self.keep_bytes = settings.keep_bytes
        self.latest = latest
        self.shelf = shelf
        self._snapshots: OrderedDict[int, Snapshot] = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        """The bytes of weights the kept snapshots hold."""
        return self._bytes

    def add(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` (a slot's listener); older ones go past the count or the budget;
        one of another lineage replaces them all."""
        with self._lock:
            newest = next(reversed(self._snapshots.values()), None)
            if newest is not None and newest.lineage != snapshot.lineage:
                self._snapshots.clear()
                self._bytes = 0
            if snapshot.version in self._snapshots:
                return
            if newest is not None and snapshot.version < newest.version:
                return  # versions only move forward in a lineage (a slot refuses the rest)
            self._snapshots[snapshot.version] = snapshot
            self._bytes += _nbytes(snapshot)
            while len(self._snapshots) > 1 and (
                len(self._snapshots) > self.keep or self._bytes > self.keep_bytes
            ):
                _, old = self._snapshots.popitem(last=False)
                self._bytes -= _nbytes(old)

    def lineage(self) -> str:
        """The lineage served: the current snapshot's (else the newest kept one's)."""
        current = self.latest()
        if current is not None:
            return current.lineage
        with self._lock:
            newest = next(reversed(self._snapshots.values()), None)
        return newest.lineage if newest is not None else ""

    def versions(self) -> KeptList:
        """The versions kept now (checkpoints listed from their file names)."""
        lineage = self.lineage()
        with self._lock:
            snapshots = [v for v, s in self._snapshots.items() if s.lineage == lineage]
        current = self.latest()
        if current is not None and current.version not in snapshots:
            snapshots.append(current.version)
        checkpoints = self.shelf.versions(lineage) if self.shelf is not None else []
        return KeptList(tuple(sorted(snapshots, reverse=True)), tuple(checkpoints))

    def get(self, version: int) -> Snapshot | None:
        """The snapshot of ``version`` held in memory (a kept snapshot, the current one, a
        checkpoint read before), else None; reads nothing from disk."""
        current = self.latest()
        if current is not None and current.version == version:
            return current
        lineage = current.lineage if current is not None else self.lineage()
        with self._lock:
            kept = self._snapshots.get(version)
        if kept is not None and kept.lineage == lineage:
            return kept
        return self.shelf.cached(version, lineage) if self.shelf is not None else None

    def load(self, version: int) -> Snapshot:
        """The snapshot of ``version``, a checkpoint read from disk if need be (call it off the
        event loop); ``VersionNotKept`` naming the kept versions when there is none."""
        found = self.get(version)
        if found is None and self.shelf is not None:
            found = self.shelf.load(self.name, version, self.lineage())
        if found is None:
            raise self.not_kept(version)
        return found

    def has(self, version: int) -> bool:
        """Whether ``version`` is kept (in memory or as a checkpoint; nothing is read)."""
        return self.get(version) is not None or self.on_disk(version)

    def on_disk(self, version: int) -> bool:
        """Whether ``version`` is a checkpoint to read (``load`` then reads the disk)."""
        return self.shelf is not None and version in self.shelf.versions(self.lineage())

    def not_kept(self, version: int) -> VersionNotKept:
        """The error for a ``version`` not kept: it names the versions that are."""
        return VersionNotKept(
            f"version {version} of model {self.name} is not kept (expired, or never made); "
            f"kept: {self.versions().describe()}"
        )


def _nbytes(snapshot: Snapshot) -> int:
    return sum(int(w.nbytes) for w in snapshot.weights)
