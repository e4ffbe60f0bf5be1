"""Write-ahead log of accepted sample messages: what makes an acknowledged sample durable.

The ingest worker appends each accepted message (model, content type, raw payload), commits a
group of them with one fsync, and only then acknowledges them to the broker. Each record gets
a position, increasing across the whole log; a checkpoint records the position up to which a
model has trained, and segments wholly before every model's checkpoint are deleted. On start,
records past a model's checkpoint are replayed into its queue.

Record layout (little-endian): u32 body length, u32 CRC-32 of the body, then the body:
u64 position, u16 model length, model, u16 content-type length, content type, payload.
The CRC does not cover the length field: a damaged length makes the body it delimits fail the
CRC, which is what matters. Within a segment positions increase (the segment's name is the
first one), so the body's position is also a frame marker for finding the next record.

Damaged records (a flipped bit, a block of zeros) and a torn tail are told apart by what follows
them, as LevelDB's log reader and RocksDB's ``kTolerateCorruptedTailRecords`` do: a record that
fails its CRC is skipped when an intact record follows it in the segment, and only when none
does is it a torn tail (a crash mid-write), cut off on open when it ends the newest segment. A
crash only ever tears the newest segment: a damaged end of a closed one is skipped and counted
like a record in the middle (the records up to the next segment's first position). The
next record after a damaged one is found where its own length field says (a damaged payload),
else by scanning byte by byte for a header whose position lies just above the last good one
and whose CRC holds (a damaged length field). A skipped record is logged with its segment, byte
offset, size and the positions it held, and kept in ``skipped`` (the learner counts them in
``livefit_wal_corrupt_records_total``); the rest of the log replays. The skipped records'
samples are lost: their bytes are what is damaged.

The directory can disappear under a running log (``rm -rf`` of the storage dir, a volume
unmounted): every group commit checks, after its fsync, that the open segment is still linked
(``st_nlink``) and that the directory is still the one it opened (``st_dev``/``st_ino``). When
not, nothing written since is reachable by a restart: ``StorageError`` (op ``storage_lost``) is
raised for that group and every later one, for good (the log never writes into a directory that
replaced its own; restart the learner to start over), so no message is acknowledged.

Storage faults: a group is written, flushed and fsynced under one lock (``write_group``). If any
of that fails, the group is not durable: ``StorageError`` is raised, the segment is abandoned
(cut back, best effort, to what its last good fsync covered, and never written again: a retried
fsync can report success for pages the kernel already dropped) and the next group starts a new
segment. Positions handed to the failed group are never reused, so a record that did reach the
disk anyway cannot be confused with a later one. The caller keeps the group unacknowledged and
retries it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<II")
_POSITION = struct.Struct("<QH")
_LENGTH = struct.Struct("<H")
SUFFIX = ".wal"
# Resync after a damaged record accepts a record whose position is at most this far above the
# last good one (positions in a segment are consecutive: a failed group abandons its segment).
RESYNC_POSITION_WINDOW = 1 << 20
_RESYNC_BLOCK = 1 << 16  # bytes searched at once for the next record after a damaged one


class StorageError(OSError):
    """A write or fsync of the log failed: nothing of the group it was writing is durable.

    ``op`` is a bounded metric label: ``wal_write``, ``wal_fsync``, ``wal_open`` or
    ``storage_lost`` (the log's directory or open segment was deleted or replaced)."""

    def __init__(self, op: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"{op}: {cause.strerror or cause}")
        self.op = op
        self.cause = cause


@dataclass(frozen=True, slots=True)
class WalRecord:
    position: int
    model: str
    content_type: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class SkippedRecord:
    """Damaged bytes skipped in the middle of a segment: ``size`` bytes at byte ``offset`` of
    ``segment``, holding ``records`` records (the gap in positions between ``after`` and the
    next intact record, at least one)."""

    segment: str
    offset: int
    size: int
    after: int
    records: int


class WriteAheadLog:
    """Segmented, CRC-checked, group-committed log. Appends from one thread; truncate from any."""

    def __init__(
        self, directory: Path, segment_bytes: int = 64 * 1024 * 1024, fsync: bool = True
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None  # the open segment (unbuffered: see ``_write``)
        self._buffer = bytearray()  # appended, not yet written to the segment
        self._segment_first = 0
        self._segment_size = 0
        self._durable_size = 0  # bytes of the current segment covered by a successful fsync
        self.next_position = 1
        # The oldest position the log held when opened (segments before it were truncated):
        # its oldest segment's first record, or the next position when it held none.
        self.first_position = 1
        self.bytes_written = 0
        self._last_of: dict[str, int] = {}  # newest position appended per model
        self.skipped: list[SkippedRecord] = []  # damaged records found (once each)
        self._lost: str | None = None  # why the directory is no longer ours, once it is not
        directory.mkdir(parents=True, exist_ok=True)
        self._identity = _identity(directory.stat())

    # reading -------------------------------------------------------------------------------
    def replay(self, after: int = 0) -> Iterator[WalRecord]:
        """Every intact record with a position above ``after``, oldest first."""
        segments = self._segments()
        for segment, following in itertools.zip_longest(segments, segments[1:]):
            for record in self._read_segment(segment, following):
                if record.position > after:
                    yield record

    def open(self, start_after: int = 0) -> None:
        """Repair a torn tail, then append after the last record (and after ``start_after``)."""
        last = 0
        segments = self._segments()
        first = _first_position(segments[0]) if segments else None
        for segment, following in itertools.zip_longest(segments, segments[1:]):
            for record in self._read_segment(segment, following, repair=following is None):
                first = min(first or record.position, record.position)
                last = max(last, record.position)
                self._last_of[record.model] = max(
                    self._last_of.get(record.model, 0), record.position
                )
        self.next_position = max(last, start_after) + 1
        self.first_position = first or self.next_position
        self._start_segment()

    # writing -------------------------------------------------------------------------------
    def append(self, model: str, payload: bytes, content_type: str | None) -> int:
        """Buffer one record; durable only after ``commit``. Returns its position.
        (Single-writer convenience; the ingest path uses ``write_group``.)"""
        with self._lock:
            return self._append_locked(model, payload, content_type)

    def write_group(self, records: Sequence[tuple[str, bytes, str | None]]) -> list[int]:
        """Append ``records`` (model, payload, content type), flush and fsync them as one group;
        returns their positions. Raises ``StorageError`` when the group is not durable."""
        with self._lock:
            self._check_lost()
            positions = [self._append_locked(m, p, ct) for m, p, ct in records]
            self._commit_locked()
            self._check_lost()
        return positions

    @property
    def lost(self) -> str | None:
        """Why the log's directory is no longer the one it writes to (None while it is)."""
        return self._lost

    def mark_lost(self, reason: str) -> None:
        """Refuse every later group (``storage_lost``): the storage is gone or replaced."""
        with self._lock:
            self._set_lost(reason)

    def _set_lost(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            log.error(
                "write-ahead log %s: %s; nothing more is written or acknowledged "
                "(restart the learner: the broker redelivers what was not acknowledged)",
                self.directory, reason,
            )  # fmt: skip

    def _check_lost(self) -> None:
        """Raise ``StorageError("storage_lost")`` when the open segment was unlinked or the
        directory was removed or replaced since the log opened it (sticky)."""
        if self._lost is None:
            fd = self._fd
            try:
                if fd is not None and os.fstat(fd).st_nlink == 0:
                    self._set_lost("its open segment was deleted")
                elif _identity(os.stat(self.directory)) != self._identity:
                    self._set_lost("its directory was replaced by another one")
            except FileNotFoundError:
                self._set_lost("its directory was deleted")
            except OSError:  # cannot tell (EIO, ...): the write and fsync say what fails
                pass
        if self._lost is not None:
            raise StorageError("storage_lost", OSError(errno.ENOENT, self._lost))

    def _append_locked(self, model: str, payload: bytes, content_type: str | None) -> int:
        position = self.next_position
        self.next_position += 1  # never reused, even when the write below fails
        record = _encode(position, model, payload, content_type)
        op = "wal_open"
        try:
            if self._fd is None:
                self._start_segment(position)
            elif self._segment_size >= self.segment_bytes:
                self._roll(position)  # named after its first record (next_position is past it)
            op = "wal_write"
            self._write(record)
        except OSError as exc:
            self._abandon_segment()
            raise StorageError(op, exc) from exc
        self._segment_size += len(record)
        self._last_of[model] = position
        self.bytes_written += len(record)
        return position

    def frontier(self, model: str, trained: int) -> int:
        """The position up to which ``model`` needs nothing from the log, given it trained
        through ``trained``: the whole log so far when it has no newer record, else ``trained``.
        """
        with self._lock:
            if self._last_of.get(model, 0) <= trained:
                return self.next_position - 1
            return trained

    def commit(self) -> None:
        """Flush and fsync everything appended so far; ``StorageError`` if that fails."""
        with self._lock:
            self._commit_locked()

    def _commit_locked(self) -> None:
        fd = self._fd
        if fd is None:
            return
        op = "wal_write"
        try:
            self._drain(fd)
            op = "wal_fsync"
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            self._abandon_segment()
            raise StorageError(op, exc) from exc
        self._durable_size = self._segment_size

    def truncate(self, upto: int) -> int:
        """Delete segments holding only positions <= ``upto``; returns how many were deleted."""
        with self._lock:
            if self._lost is not None:  # never touch a directory that replaced ours
                return 0
            if self._fd is not None and self._segment_first <= upto and self._segment_size > 0:
                try:
                    self._roll()
                except OSError:  # the next append starts a fresh segment
                    self._abandon_segment()
            removed = 0
            segments = self._segments()
            for current, following in itertools.pairwise(segments):
                if _first_position(following) - 1 <= upto:
                    current.unlink()
                    removed += 1
            return removed

    def close(self) -> None:
        """Commit what is buffered (best effort: a failure is logged, not raised) and close."""
        try:
            self.commit()
        except StorageError as exc:
            log.error("write-ahead log: final commit failed (%s)", exc)
        with self._lock:
            fd, self._fd = self._fd, None
            self._buffer.clear()  # what the final commit could not write is not durable
            if fd is not None:
                try:
                    os.close(fd)
                except OSError as exc:
                    log.error("write-ahead log: close failed (%s)", exc)

    # internals -----------------------------------------------------------------------------
    def _segments(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    def _start_segment(self, first: int | None = None) -> None:
        """Open a segment named after ``first``, the position of its first record (by default
        the next position)."""
        self._segment_first = self.next_position if first is None else first
        path = self.directory / f"{self._segment_first:020d}{SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._segment_size = self._durable_size = os.fstat(self._fd).st_size

    def _roll(self, first: int | None = None) -> None:
        if self._fd is not None:
            self._drain(self._fd)
            if self.fsync:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        self._start_segment(first)

    def _abandon_segment(self) -> None:
        """After a failed write or fsync: cut the segment back to its last good fsync (best
        effort) and stop writing to it; the next append opens a new segment."""
        fd, self._fd = self._fd, None
        self._buffer.clear()  # never written after the cut (a buffered file's close would)
        if fd is None:
            return
        # Records past the cut that stay anyway (the cut failed) are whole or torn.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, self._durable_size)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _write(self, record: bytes) -> None:
        """Buffer a record; ``_drain`` writes the buffer out. The log keeps its own buffer,
        not a buffered file's: a buffered file writes what it held when it is closed, and
        after a failed group that put the group's records after the cut, where the resync
        past damaged records would find them intact and replay records never acknowledged."""
        assert self._fd is not None, "open() the log before appending"
        self._buffer += record

    def _drain(self, fd: int) -> None:
        """Write the buffer to the segment (O_APPEND); on failure the caller abandons it."""
        data, self._buffer = bytes(self._buffer), bytearray()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _read_segment(
        self, path: Path, following: Path | None = None, repair: bool = False
    ) -> Iterator[WalRecord]:
        """The segment's intact records; damaged ones followed by intact ones are skipped
        (logged and kept in ``skipped``). A damaged tail of the newest segment is torn (cut when
        ``repair``); one of a closed segment (``following`` is the next) is damage, skipped
        like a record in the middle: a crash mid-write only ever tears the newest segment."""
        data = path.read_bytes()
        offset = 0
        floor = _first_position(path) - 1  # every position in the segment is above it
        while offset < len(data):
            record, size = _parse(data, offset)
            if record is not None:
                yield record
                floor = max(floor, record.position)
                offset += size
                continue
            resumed = _resync(data, offset, floor)
            if resumed is None:
                if following is None:
                    self._torn(path, offset, len(data), repair)
                else:
                    self._skip_tail(path, offset, data, floor, _first_record(following))
                return
            self._skip(path, offset, resumed, data, floor)
            offset = resumed

    def _skip(self, path: Path, offset: int, following: int, data: bytes, floor: int) -> None:
        record, _ = _parse(data, following)
        assert record is not None
        skipped = SkippedRecord(
            path.name, offset, following - offset, floor, max(1, record.position - floor - 1)
        )
        if any(s.segment == skipped.segment and s.offset == offset for s in self.skipped):
            return  # found again (open and replay both read the log): reported once
        self.skipped.append(skipped)
        log.error(
            "write-ahead log %s: skipped a corrupt record at byte %d of %d (%d bytes, %d "
            "record(s) after position %d: their samples are lost); replaying the rest from "
            "byte %d (position %d)",
            path.name, offset, len(data), skipped.size, skipped.records, floor, following,
            record.position,
        )  # fmt: skip

    def _skip_tail(self, path: Path, offset: int, data: bytes, floor: int, next_first: int) -> None:
        """A closed segment ends in damaged bytes: the records between its last intact one and
        the next segment's first are lost (at least one)."""
        skipped = SkippedRecord(
            path.name, offset, len(data) - offset, floor, max(1, next_first - floor - 1)
        )
        if any(s.segment == skipped.segment and s.offset == offset for s in self.skipped):
            return  # found again (open and replay both read the log): reported once
        self.skipped.append(skipped)
        log.error(
            "write-ahead log %s: skipped a corrupt record at byte %d of %d that ends this closed "
            "segment (%d bytes, %d record(s) after position %d, before the next segment's first "
            "%d: their samples are lost); replaying the rest from the next segment",
            path.name, offset, len(data), skipped.size, skipped.records, floor, next_first,
        )  # fmt: skip

    def _torn(self, path: Path, offset: int, total: int, repair: bool) -> None:
        if repair:
            log.warning(
                "write-ahead log %s: cutting a torn record at byte %d of %d (no intact record "
                "follows it)",
                path.name,
                offset,
                total,
            )
            with path.open("r+b") as handle:
                handle.truncate(offset)
        else:
            log.error(
                "write-ahead log %s: corrupt record at byte %d and no intact record after it; "
                "rest of segment skipped",
                path.name,
                offset,
            )


def _encode(position: int, model: str, payload: bytes, content_type: str | None) -> bytes:
    model_bytes = model.encode()
    ct = (content_type or "").encode()
    body = b"".join(
        (_POSITION.pack(position, len(model_bytes)), model_bytes, _LENGTH.pack(len(ct)), ct,
         payload)
    )  # fmt: skip
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def _parse(data: bytes, offset: int) -> tuple[WalRecord | None, int]:
    """The intact record at ``offset`` and its size, or (None, 0)."""
    if offset + _HEAD.size > len(data):
        return None, 0
    length, crc = _HEAD.unpack_from(data, offset)
    start = offset + _HEAD.size
    body = data[start : start + length]
    if len(body) != length or length < _POSITION.size + _LENGTH.size or zlib.crc32(body) != crc:
        return None, 0
    try:
        position, model_len = _POSITION.unpack_from(body, 0)
        cursor = _POSITION.size
        model = body[cursor : cursor + model_len].decode()
        cursor += model_len
        (ct_len,) = _LENGTH.unpack_from(body, cursor)
        cursor += _LENGTH.size
        content_type = body[cursor : cursor + ct_len].decode() or None
    except (struct.error, UnicodeDecodeError):  # a CRC that holds by chance over garbage
        return None, 0
    cursor += ct_len
    return WalRecord(position, model, content_type, body[cursor:]), _HEAD.size + length


def _plausible(data: bytes, offset: int, floor: int) -> bool:
    """Whether an intact record with a position just above ``floor`` starts at ``offset``."""
    if offset + _HEAD.size + _POSITION.size > len(data):
        return False
    (position,) = struct.unpack_from("<Q", data, offset + _HEAD.size)
    if not floor < position <= floor + RESYNC_POSITION_WINDOW:
        return False
    record, _ = _parse(data, offset)
    return record is not None


def _resync(data: bytes, offset: int, floor: int) -> int | None:
    """Where the next intact record after the damaged one at ``offset`` starts, or None (a
    torn tail). First where the damaged record's length field says (its payload is what is
    damaged), then at every later byte (its length field is), block by block: the bytes whose
    position field lies just above ``floor`` are found with numpy, and only those parsed."""
    if offset + _HEAD.size <= len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        following = offset + _HEAD.size + length
        if following < len(data) and _plausible(data, following, floor):
            return following
    for block in range(offset + 1, len(data), _RESYNC_BLOCK):
        for candidate in _candidates(data, block, min(len(data), block + _RESYNC_BLOCK), floor):
            if _plausible(data, candidate, floor):
                return candidate
    return None


def _candidates(data: bytes, start: int, end: int, floor: int) -> list[int]:
    """The offsets in [start, end), ascending, where a record whose position field lies in
    (floor, floor + RESYNC_POSITION_WINDOW] could start."""
    low, high = np.uint64(floor), np.uint64(min(floor + RESYNC_POSITION_WINDOW, 2**64 - 1))
    found: list[int] = []
    for phase in range(8):
        first = start + phase + _HEAD.size  # where the position field of such a record is
        count = min((end - start - phase + 7) // 8, (len(data) - first) // 8)
        if count <= 0:
            continue
        values = np.frombuffer(data, dtype="<u8", count=count, offset=first)
        hits = np.flatnonzero((values > low) & (values <= high))
        found.extend((start + phase + 8 * hits).tolist())
    return sorted(found)


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _first_position(path: Path) -> int:
    return int(path.name.removesuffix(SUFFIX))


def _first_record(path: Path) -> int:
    """The position of the segment's first record when it is intact, else its name's (older
    versions named a segment started by size one past its first record)."""
    with contextlib.suppress(OSError):
        record, _ = _parse(path.read_bytes(), 0)
        if record is not None:
            return min(record.position, _first_position(path))
    return _first_position(path)
