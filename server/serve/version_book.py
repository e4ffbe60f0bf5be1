"""The learner's book of a model's serving record (``VersionBook``): the one writer of labels,
the pin and rollbacks. Each move is checked against the versions kept (``KeptVersions``: a
version must be kept to be named), written durably before anyone hears of it (the named
version's payload, then the record: ``storage.serving_record_file``), then applied to serving,
announced (the weight stream signs it into every envelope and retains each named payload; the
event topic; the metric) and answered.

Its calls may read a checkpoint and fsync: run them off the event loop. Moves are serialised by
one lock; a move that fails changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..storage.serving_record_file import ServingRecordFile
from ..wire.serving_record import (
    LATEST,
    MAX_LABELS,
    RecordError,
    Rollback,
    ServingRecord,
    check_label,
)
from ..wire.snapshot import Snapshot
from .versions import KeptVersions, VersionNotKept

log = logging.getLogger(__name__)
GUARD_ACTIONS = ("guard_hold", "guard_release")  # the guard's moves, never an operator's
CONTINUE_TIMEOUT_S = 30.0  # a rollback that trains on waits this long for the trainer's thread


class MoveRefused(Exception):
    """A move that cannot be made: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Move:
    """What an operator asked: ``action`` one of label, unlabel, default, pin, unpin, rollback;
    or what the guard did (``GUARD_ACTIONS``: hold a version, release it)."""

    action: str
    label: str | None = None
    version: int | None = None
    mode: str = "serve"  # a rollback's: serving holds the version, or the trainer goes on from it


Announce = Callable[[ServingRecord, dict[int, bytes], Move], None]


class VersionBook:
    """Model ``name``'s serving record on the learner (module docstring)."""

    def __init__(
        self,
        name: str,
        versions: KeptVersions,
        file: ServingRecordFile,
        encode: Callable[[Snapshot], bytes],
        lineage: Callable[[], str],
        announce: Announce,
        continue_from: Callable[[Snapshot, float], int] | None = None,
    ) -> None:
        """``encode``: a snapshot's weight payload; ``announce(record, new payloads, move)``
        tells the weight stream, the serving processes and the event topic; ``continue_from``
        (snapshot, timeout) has the trainer go on from a snapshot, returning its new version."""
        self.name = name
        self.versions = versions
        self.file = file
        self.encode = encode
        self.lineage = lineage
        self.announce = announce
        self.continue_from = continue_from
        self._lock = threading.Lock()
        versions.held_source = file.load_held

    def restore(self) -> ServingRecord:
        """The record on disk when it is of the lineage trained now (another lineage's labels
        name another history's versions: dropped, with a log line); else an empty one."""
        found = self.file.load()
        lineage = self.lineage()
        if found is not None and found.lineage != lineage:
            log.warning(
                "model %s: the serving record of lineage %s is not this lineage's (%s); labels "
                "and pin start empty", self.name, found.lineage, lineage,
            )  # fmt: skip
            found = None
        record = found or ServingRecord(self.name, lineage)
        self.versions.apply(record)
        if record.named():
            log.info("model %s: serving record restored: %s", self.name, describe(record))
        return record

    def record(self) -> ServingRecord:
        return self.versions.record or ServingRecord(self.name, self.lineage())

    def move(self, move: Move) -> ServingRecord:
        """Make ``move``; the record after it. ``MoveRefused`` (400, 404, 409, 503) says why not
        (503 also when the record cannot be written: then nothing moved, here or anywhere)."""
        with self._lock:
            try:
                return self._move(move)
            except RecordError as exc:
                raise MoveRefused(400, str(exc)) from None
            except OSError as exc:  # a full or read-only disk: the record before it stands
                raise MoveRefused(
                    503,
                    f"model {self.name}: the serving record could not be written in "
                    f"{self.file.directory} ({exc.strerror or exc}); nothing moved, retry once "
                    "it can be written",
                ) from None

    def _move(self, move: Move) -> ServingRecord:
        record = self.record()
        now = time.time()
        if move.action == "label":
            label, version = check_label(move.label or ""), self._version(move)
            if label not in record.labels and len(record.labels) >= MAX_LABELS:
                # one more would make a record no receiver (nor this book, restarted) reads
                raise MoveRefused(409, f"model {self.name} has {MAX_LABELS} labels, the most a "
                                       "record holds; remove one first")  # fmt: skip
            after = record.moved(now, labels={**record.labels, label: version})
        elif move.action == "unlabel":
            label = self._known_label(record, move.label)
            default = LATEST if record.default == label else record.default
            labels = {k: v for k, v in record.labels.items() if k != label}
            after = record.moved(now, labels=labels, default=default)
        elif move.action == "default":
            label = move.label or LATEST
            if label != LATEST:
                self._known_label(record, label)
            after = record.moved(now, default=label)
        elif move.action == "pin":
            after = record.moved(now, pinned=self._pin_version(move))
        elif move.action == "unpin":
            after = record.moved(now, pinned=None)
        elif move.action == "rollback":
            after = self._roll_back(record, move, now)
        elif move.action == "guard_hold":
            after = record.moved(now, guarded=self._version(move))
        elif move.action == "guard_release":
            after = record.moved(now, guarded=None)
        else:
            raise MoveRefused(400, f"unknown action {move.action!r}")
        return self._commit(record, after, move)

    def _version(self, move: Move) -> int:
        if move.version is None:
            raise MoveRefused(400, f"{move.action} needs a version")
        return move.version

    def _pin_version(self, move: Move) -> int:
        """The version asked for; unset, the one served now."""
        if move.version is not None:
            return move.version
        current = self.versions.served() or self.versions.latest()
        if current is None:
            raise MoveRefused(503, f"model {self.name} has no version yet to pin; retry shortly")
        return current.version

    def _known_label(self, record: ServingRecord, label: str | None) -> str:
        if label is None or label not in record.labels:
            known = ", ".join(sorted(record.labels)) or "none"
            raise MoveRefused(404, f"model {self.name} has no label {label!r}; its labels: {known}")
        return label

    def _roll_back(self, record: ServingRecord, move: Move, now: float) -> ServingRecord:
        source = self._version(move)
        if move.mode == "serve":
            rollbacks = (*record.rollbacks, Rollback(source, "serve", source, now))
            return record.moved(now, pinned=source, rollbacks=rollbacks)
        if move.mode != "train":
            raise MoveRefused(400, f"a rollback's mode is serve or train, got {move.mode!r}")
        if self.continue_from is None:
            raise MoveRefused(409, f"model {self.name} is not trained here")
        snapshot = self._snapshot(source)
        try:
            version = self.continue_from(snapshot, CONTINUE_TIMEOUT_S)
        except ValueError as exc:
            raise MoveRefused(409, str(exc)) from None
        except TimeoutError:
            raise MoveRefused(503, f"the trainer of {self.name} did not take the rollback in "
                                   f"{CONTINUE_TIMEOUT_S:g} s; retry") from None  # fmt: skip
        rollbacks = (*record.rollbacks, Rollback(source, "train", version, now))
        return record.moved(now, pinned=None, rollbacks=rollbacks)

    def _snapshot(self, version: int) -> Snapshot:
        """The kept snapshot of ``version`` (a checkpoint read from disk if need be)."""
        try:
            return self.versions.load(version)
        except VersionNotKept as exc:
            raise MoveRefused(404, str(exc)) from None

    def _commit(self, before: ServingRecord, after: ServingRecord, move: Move) -> ServingRecord:
        """Write the newly named payloads, then the record; then serving and the world hear."""
        added: dict[int, bytes] = {}
        versions = dict(after.versions)
        for version in sorted(after.named() - set(before.versions)):
            payload = self.encode(self._snapshot(version))
            versions[version] = self.file.save_held(version, payload)
            added[version] = payload
        after = replace(after, versions=versions)
        self.file.save(after)  # durable before anyone serves by it
        self.versions.apply(after)
        self.announce(after, added, move)
        log.info("model %s: %s: %s", self.name, move.action, describe(after))
        return after


def describe(record: ServingRecord) -> str:
    """A record in one line: labels, the default, the pin."""
    labels = ", ".join(f"{k}={v}" for k, v in sorted(record.labels.items())) or "no labels"
    pinned = f"pinned to v{record.pinned}" if record.pinned is not None else "not pinned"
    guarded = f", the guard holds v{record.guarded}" if record.guarded is not None else ""
    return f"{labels}; the unversioned path serves {record.default}, {pinned}{guarded}"
