"""Checkpoints: a model's weights, optimizer state, version and log position, on disk.

A checkpoint is one safetensors file ``<dir>/<model>/ckpt-<version>.safetensors``: tensors
``w:NNNN`` (model weights) and ``o:NNNN`` (optimizer variables), extra named arrays
(``x:<name>``, e.g. scaling statistics) and notes (``n:<name>``: bytes such as the delayed
labels' pending state, as uint8 tensors, so their size is not bounded by safetensors' 100 MB
header), and ``s:NNNN``, the weights served at that version where they are not the trained ones
(the weight average, another candidate: metadata ``served`` is ``s``, else ``w``); metadata
holds the version, samples seen, the write-ahead-log position trained through, the creation
time, the lineage and ``checksum``: a sha256 over every metadata field
and every tensor's name, dtype, shape and bytes, i.e. over everything a restore reads (a
flipped bit in the log position is caught, not only one in the weights or a truncated file).
Files are written to a temporary name, fsynced and renamed, and the directory fsynced: a
reader sees a whole checkpoint or none. The newest ``keep`` are kept.

Loading takes the newest checkpoint that reads and passes its checksum. One that fails it is
set aside: renamed to ``<name>.corrupt`` (kept for inspection, never read again), logged, and
listed in ``set_aside`` for the caller to count; the previous one is used. Checkpoints written
before the checksum covered the metadata (format 1: ``sha256`` over the tensors only, notes in
the header) are still read, their metadata unverified.

The version high-water mark is a separate tiny file: the trainer claims versions in blocks
there before using them, so that a restarted learner continues above every version it ever
handed out, even when it crashed long after its last checkpoint.

The lineage is another tiny file, ``lineage``: a random id made when the directory is first
created, naming the history the versions count (a learner with a new storage dir starts a new
lineage at version 0; receivers compare versions only within a lineage). Every checkpoint
records it in its metadata too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

if TYPE_CHECKING:
    from ..wire.snapshot import Snapshot

log = logging.getLogger(__name__)
PREFIX = "ckpt-"
SUFFIX = ".safetensors"


@dataclass(frozen=True)
class Checkpoint:
    """Everything needed to continue training where it stopped."""

    model: str
    version: int
    samples_seen: int
    position: int  # write-ahead-log position trained through (0: none)
    weights: list[np.ndarray]
    optimizer: list[np.ndarray]
    created_at: float = field(default_factory=time.time)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    notes: dict[str, bytes] = field(default_factory=dict)  # other state (dedup, labels)
    lineage: str = ""  # the history ``version`` counts in (see module docstring)
    # The weights served at ``version`` where they are not ``weights`` (the average, or another
    # candidate); None: ``weights`` were served, or (``served_known`` False) nobody recorded it.
    served: list[np.ndarray] | None = None
    served_known: bool = True  # False for a checkpoint written before this was recorded

    @property
    def served_weights(self) -> list[np.ndarray] | None:
        """What serving predicted with at ``version``; None where that is not on record."""
        if not self.served_known:
            return None
        return self.served if self.served is not None else self.weights

    @classmethod
    def from_snapshot(
        cls,
        snapshot: Snapshot,
        *,
        position: int,
        optimizer: list[np.ndarray],
        extra: dict[str, np.ndarray] | None = None,
        notes: dict[str, bytes] | None = None,
        trained: list[np.ndarray] | None = None,
    ) -> Checkpoint:
        """A checkpoint of ``snapshot``'s weights plus the training state beside them.

        The weights are the snapshot's own arrays (immutable, shared with serving and the
        weight stream): one copy of the weights leaves the trainer, whoever reads it.
        ``optimizer`` must be taken at ``snapshot.version`` (on the trainer's thread).
        ``trained``: the weights training continues from where they are not the snapshot's
        (which were served: the checkpoint then keeps both)."""
        return cls(
            model=snapshot.model,
            version=snapshot.version,
            samples_seen=snapshot.samples_seen,
            position=position,
            weights=list(snapshot.weights) if trained is None else list(trained),
            served=None if trained is None else list(snapshot.weights),
            optimizer=optimizer,
            extra=extra or {},
            notes=notes or {},
            lineage=snapshot.lineage,
        )


class CheckpointError(Exception):
    """A checkpoint file is unreadable or fails its checksum."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint file was read but its contents are damaged (checksum, format)."""


class CheckpointStore:
    """Checkpoints of one model in ``directory``, newest ``keep`` kept."""

    def __init__(self, directory: Path, model: str, keep: int = 3) -> None:
        self.directory = directory
        self.model = model
        self.keep = keep
        self.set_aside: list[Path] = []  # corrupt checkpoints the last load_latest renamed
        new = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        if new:
            self.new_lineage()

    def write(self, checkpoint: Checkpoint) -> Path:
        """Write atomically, then delete all but the newest ``keep``; returns the path."""
        tensors = {f"w:{i:04d}": np.ascontiguousarray(a) for i, a in enumerate(checkpoint.weights)}
        tensors.update(
            {f"o:{i:04d}": np.ascontiguousarray(a) for i, a in enumerate(checkpoint.optimizer)}
        )
        tensors.update({f"x:{k}": np.ascontiguousarray(a) for k, a in checkpoint.extra.items()})
        tensors.update({f"n:{k}": np.frombuffer(v, np.uint8) for k, v in checkpoint.notes.items()})
        if checkpoint.served is not None:
            tensors.update(
                {f"s:{i:04d}": np.ascontiguousarray(a) for i, a in enumerate(checkpoint.served)}
            )
        metadata = {
            "format": "2",
            "model": checkpoint.model,
            "version": str(checkpoint.version),
            "samples_seen": str(checkpoint.samples_seen),
            "position": str(checkpoint.position),
            "created_at": repr(checkpoint.created_at),
            "lineage": checkpoint.lineage,
            # what was served at this version: the "w:" weights, or the "s:" ones beside them
            "served": "s" if checkpoint.served is not None else "w",
        }
        metadata["checksum"] = _checksum(metadata, tensors)
        path = checkpoint_path(self.directory, checkpoint.version)
        atomic_write(path, bytes(st_save(tensors, metadata=metadata)))
        self._prune()
        return path

    def paths(self) -> list[Path]:
        """Checkpoint files, newest first."""
        return sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}"), reverse=True)

    def load_latest(self) -> Checkpoint | None:
        """The newest usable checkpoint. A newer one that fails its checksum (or cannot be
        parsed) is set aside (renamed ``.corrupt``, logged, appended to ``set_aside``); one that
        cannot be read (an I/O error) is logged and skipped."""
        self.set_aside = []
        for path in self.paths():
            try:
                return self.load(path)
            except CorruptCheckpoint as exc:
                self._set_aside(path, exc)
            except CheckpointError as exc:
                log.error(
                    "checkpoint %s is unusable (%s); falling back to the previous one", path, exc
                )
        return None

    def _set_aside(self, path: Path, exc: CheckpointError) -> None:
        aside = path.with_name(path.name + ".corrupt")
        try:
            path.replace(aside)
        except OSError as error:
            log.error("checkpoint %s is corrupt (%s) and could not be set aside (%s); falling "
                      "back to the previous one", path, exc, error)  # fmt: skip
            return
        self.set_aside.append(aside)
        log.error(
            "checkpoint %s is corrupt (%s): set aside as %s; falling back to the previous one",
            path, exc, aside.name,
        )  # fmt: skip

    def load(self, path: Path) -> Checkpoint:
        """Read and verify one checkpoint (``read_checkpoint``)."""
        return read_checkpoint(path)

    def _prune(self) -> None:
        for old in self.paths()[self.keep :]:
            old.unlink(missing_ok=True)

    # version high-water mark ---------------------------------------------------------------
    @property
    def _mark(self) -> Path:
        return self.directory / "version-high-water-mark"

    def write_high_water_mark(self, version: int) -> None:
        """Record that versions up to ``version`` may have been used (atomic and fsynced: it
        survives a process crash and a power loss)."""
        atomic_write(self._mark, str(version).encode())

    def high_water_mark(self) -> int:
        try:
            return int(self._mark.read_text().strip())
        except (OSError, ValueError):
            return 0

    # lineage --------------------------------------------------------------------------------
    @property
    def _lineage_file(self) -> Path:
        return self.directory / "lineage"

    def lineage(self) -> str:
        """This directory's lineage id; made (and stored) if it has none yet."""
        try:
            value = self._lineage_file.read_text().strip()
        except OSError:
            value = ""
        return value if _is_lineage(value) else self.new_lineage()

    def new_lineage(self) -> str:
        """Start a new lineage: a fresh random id, stored atomically; returns it."""
        value = new_lineage_id()
        atomic_write(self._lineage_file, value.encode())
        return value


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one checkpoint: ``CorruptCheckpoint`` when its contents are damaged,
    ``CheckpointError`` when it cannot be read at all."""
    try:
        payload = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        tensors = st_load(payload)
        header_len = int.from_bytes(payload[:8], "little")
        meta = json.loads(payload[8 : 8 + header_len]).get("__metadata__", {})
        if "checksum" in meta:
            fields = {k: v for k, v in meta.items() if k != "checksum"}
            if meta["checksum"] != _checksum(fields, tensors):
                raise CorruptCheckpoint("checksum mismatch (metadata or tensors)")
            notes = {k[2:]: v.tobytes() for k, v in tensors.items() if k.startswith("n:")}
        elif "sha256" in meta:  # format 1: the checksum covers the tensors only
            if meta["sha256"] != _digest(tensors):
                raise CorruptCheckpoint("checksum mismatch")
            notes = {k[5:]: v.encode() for k, v in meta.items() if k.startswith("note:")}
        else:
            raise CorruptCheckpoint("no checksum")
        return Checkpoint(
            model=meta["model"],
            version=int(meta["version"]),
            samples_seen=int(meta["samples_seen"]),
            position=int(meta["position"]),
            weights=_ordered(tensors, "w:"),
            optimizer=_ordered(tensors, "o:"),
            created_at=float(meta["created_at"]),
            extra={k[2:]: v for k, v in tensors.items() if k.startswith("x:")},
            notes=notes,
            lineage=str(meta.get("lineage", "")),
            served=_ordered(tensors, "s:") if meta.get("served") == "s" else None,
            served_known=meta.get("served") in ("s", "w"),
        )
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpoint(f"{type(exc).__name__}: {exc}") from None


def checkpoint_versions(directory: Path) -> list[int]:
    """The versions of the checkpoints in ``directory`` by their file names, newest first
    (nothing is read or verified; none when the directory does not exist)."""
    versions = []
    for path in directory.glob(f"{PREFIX}*{SUFFIX}"):
        digits = path.name[len(PREFIX) : -len(SUFFIX)]
        if digits.isascii() and digits.isdigit():
            versions.append(int(digits))
    return sorted(versions, reverse=True)


def checkpoint_path(directory: Path, version: int) -> Path:
    """Where the checkpoint of ``version`` is (or would be) in ``directory``."""
    return directory / f"{PREFIX}{version:012d}{SUFFIX}"


def read_lineage(directory: Path) -> str:
    """The lineage id stored in ``directory``, or "" where there is none (nothing is made)."""
    try:
        value = (directory / "lineage").read_text().strip()
    except OSError:
        return ""
    return value if _is_lineage(value) else ""


def new_lineage_id() -> str:
    return uuid.uuid4().hex


def _is_lineage(value: str) -> bool:
    return 0 < len(value) <= 64 and value.isalnum()


def _ordered(tensors: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    return [tensors[k] for k in sorted(k for k in tensors if k.startswith(prefix))]


def _checksum(metadata: dict[str, str], tensors: dict[str, np.ndarray]) -> str:
    """sha256 over every metadata field and every tensor's name, dtype, shape and bytes."""
    digest = hashlib.sha256(json.dumps(metadata, sort_keys=True).encode())
    for key in sorted(tensors):
        array = np.ascontiguousarray(tensors[key])
        digest.update(json.dumps([key, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.data)
    return "sha256:" + digest.hexdigest()


def _digest(tensors: dict[str, np.ndarray]) -> str:
    """Format 1's checksum: the tensors' names and bytes only."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(tensors[key]).tobytes())
    return digest.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file, fsynced, renamed, and
    the directory fsynced (a crash leaves the old file or the new one, never half of one)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not also keep a half-written file
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
