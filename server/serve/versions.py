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

The serving record (``apply``: labels, the pin; ``wire.serving_record``) names versions that are
*held*: kept outside the count and the byte budget for as long as the record names them, from
memory where they are still there, else from their weight payload (``held_source``: the file
beside the checkpoints on the learner's processes, the retained ``held`` topic on a replica),
checked against the sha256 the signed record holds. ``served`` says which snapshot the
unversioned path serves (None: the newest), ``labelled`` which one a label names.
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
from ..weights.format import WeightsRejected, decode_weights, sha256_hex
from ..wire.serving_record import LATEST, ServingRecord
from ..wire.snapshot import Snapshot

log = logging.getLogger(__name__)
SHOWN_VERSIONS = 12  # versions a 404 names one by one; more are summarised
CHECKPOINTS_CACHED = 2  # checkpoints read from disk and held: a client asks for one many times
PENDING_HELD = 16  # payloads a replica received before the record that names them


class VersionNotKept(LookupError):
    """A version this server does not keep (expired or never made): HTTP 404, naming the kept."""


class VersionNotHere(LookupError):
    """A version the serving record names whose weights have not arrived here yet: HTTP 503."""


HeldSource = Callable[[int, str], "bytes | None"]  # (version, sha256) -> its payload, if found


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
        self.record: ServingRecord | None = None  # the operator's labels and pin (``apply``)
        self._held: dict[int, Snapshot] = {}  # the versions the record names, found so far
        self.held_source: HeldSource | None = None
        self._pending: OrderedDict[int, bytes] = OrderedDict()  # payloads before their record

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
            if self._names(snapshot):  # named before it came (a replica's record goes first)
                self._held[snapshot.version] = snapshot
                self._pending.pop(snapshot.version, None)
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
        with self._lock:  # held past the count while the record names them
            snapshots += [v for v, s in self._held.items() if s.lineage == lineage]
        checkpoints = self.shelf.versions(lineage) if self.shelf is not None else []
        return KeptList(tuple(sorted(set(snapshots), reverse=True)), tuple(checkpoints))

    def get(self, version: int) -> Snapshot | None:
        """The snapshot of ``version`` held in memory (a kept snapshot, the current one, a
        version the record names, a checkpoint read before), else None; reads nothing from
        disk."""
        current = self.latest()
        if current is not None and current.version == version:
            return current
        lineage = current.lineage if current is not None else self.lineage()
        with self._lock:
            kept = self._snapshots.get(version) or self._held.get(version)
        if kept is not None and kept.lineage == lineage:
            return kept
        return self.shelf.cached(version, lineage) if self.shelf is not None else None

    def at_or_before(self, version: int) -> Snapshot | None:
        """The newest snapshot held in memory of the served lineage whose version is at most
        ``version`` (what serving answered with before ``version``'s successors), else None."""
        current = self.latest()
        if current is not None and current.version <= version:
            return current
        lineage = current.lineage if current is not None else self.lineage()
        with self._lock:
            found = [s for v, s in self._snapshots.items() if v <= version and s.lineage == lineage]
        return found[-1] if found else None

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

    # the serving record ------------------------------------------------------------------------
    def apply(self, record: ServingRecord) -> bool:
        """Take ``record`` when it is newer than the one held (any thread): hold the versions
        it names that can be found now (the rest as their payloads arrive), release the rest.
        False when it was not newer."""
        with self._lock:
            if not record.newer_than(self.record):
                return False
            self.record = record
        self._resolve()
        return True

    def _names(self, snapshot: Snapshot) -> bool:
        """Whether the record names ``snapshot`` and it is not held yet (under the lock)."""
        record = self.record
        return (
            record is not None
            and record.lineage == snapshot.lineage
            and snapshot.version in record.named()
            and snapshot.version not in self._held
        )

    def held_arrived(self, version: int, payload: bytes) -> None:
        """A named version's payload arrived (a replica's ``held`` topic): kept until the
        record that names it, then checked against its sha256."""
        with self._lock:
            self._pending[version] = payload
            self._pending.move_to_end(version)
            while len(self._pending) > PENDING_HELD:
                self._pending.popitem(last=False)
        self._resolve()

    def missing(self) -> list[int]:
        """The versions the record names whose weights are not here yet."""
        record = self.record
        if record is None:
            return []
        with self._lock:
            return sorted(v for v in record.named() if v not in self._held)

    def served(self) -> Snapshot | None:
        """The snapshot the unversioned path serves: None for the newest; ``VersionNotHere``
        when the pinned or default-labelled version has not arrived."""
        record = self.record
        version = record.served() if record is not None else None
        return None if version is None else self._named(version, "served")

    def labelled(self, label: str) -> Snapshot | None:
        """The snapshot ``label`` names (None: ``latest``, the newest); ``KeyError`` naming the
        labels for an unknown one, ``VersionNotHere`` when its weights have not arrived."""
        record = self.record
        labels = dict(record.labels) if record is not None else {}
        if label != LATEST and label not in labels:
            known = ", ".join(sorted([LATEST, *labels]))
            raise KeyError(f"model {self.name} has no label {label!r}; its labels: {known}")
        version = labels.get(label)
        return None if version is None else self._named(version, f"label {label!r}")

    def _named(self, version: int, what: str) -> Snapshot:
        with self._lock:
            found = self._held.get(version)
        if found is None:
            raise VersionNotHere(
                f"version {version} of model {self.name} ({what}) has not reached this server "
                "yet; retry shortly"
            )
        return found

    def _resolve(self) -> None:
        """Hold every version the record names that is found (memory, then the payloads)."""
        record = self.record
        if record is None:
            return
        named = record.named()
        with self._lock:
            self._held = {v: s for v, s in self._held.items() if v in named}
            wanted = [v for v in named if v not in self._held]
        for version in wanted:
            found = self._find(record, version)
            if found is not None:
                with self._lock:
                    self._held[version] = found
                    self._pending.pop(version, None)

    def _find(self, record: ServingRecord, version: int) -> Snapshot | None:
        current = self.latest()
        if current is not None and current.version == version and current.lineage == record.lineage:
            return current
        with self._lock:
            kept = self._snapshots.get(version)
            pending = self._pending.get(version)
        if kept is not None and kept.lineage == record.lineage:
            return kept
        sha256 = record.versions.get(version)
        if sha256 is None:
            return None
        if pending is None and self.held_source is not None:
            pending = self.held_source(version, sha256)
        if pending is None or sha256_hex(pending) != sha256:
            return None
        return self._decoded(record, version, pending)

    def _decoded(self, record: ServingRecord, version: int, payload: bytes) -> Snapshot | None:
        try:
            _, arrays, meta = decode_weights(payload)
        except WeightsRejected as exc:
            log.error("held weights v%d of %s not served: %s", version, self.name, exc)
            return None
        if (meta.model, meta.version, meta.lineage) != (self.name, version, record.lineage):
            log.error("held weights of %s say %s v%d, the record v%d: not served", self.name,
                      meta.model, meta.version, version)  # fmt: skip
            return None
        return Snapshot(
            model=self.name, version=version, weights=tuple(arrays), created_at=meta.created_at,
            samples_seen=meta.samples_seen, newest_published_at=meta.newest_published_at,
            lineage=meta.lineage,
        )  # fmt: skip


def _nbytes(snapshot: Snapshot) -> int:
    return sum(int(w.nbytes) for w in snapshot.weights)
