"""Write-ahead log of accepted sample messages: what makes an acknowledged sample durable.

The ingest worker appends each accepted message (model, content type, raw payload), commits a
group of them with one fsync, and only then acknowledges them to the broker. Each record gets
a position, increasing across the whole log; a checkpoint records the position up to which a
model has trained, and segments wholly before every model's checkpoint are deleted. On start,
records past a model's checkpoint are replayed into its queue.

Record layout (little-endian): u32 body length, u32 CRC-32 of the body, then the body:
u64 position, u16 model length, model, u16 content-type length, content type, payload.
A torn record at the end of the newest segment (a crash mid-write) is cut off on open.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<II")
_POSITION = struct.Struct("<QH")
_LENGTH = struct.Struct("<H")
SUFFIX = ".wal"


@dataclass(frozen=True, slots=True)
class WalRecord:
    position: int
    model: str
    content_type: str | None
    payload: bytes


class WriteAheadLog:
    """Segmented, CRC-checked, group-committed log. Appends from one thread; truncate from any."""

    def __init__(
        self, directory: Path, segment_bytes: int = 64 * 1024 * 1024, fsync: bool = True
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._file: object | None = None
        self._segment_first = 0
        self._segment_size = 0
        self.next_position = 1
        self.bytes_written = 0
        self._last_of: dict[str, int] = {}  # newest position appended per model
        directory.mkdir(parents=True, exist_ok=True)

    # reading -------------------------------------------------------------------------------
    def replay(self, after: int = 0) -> Iterator[WalRecord]:
        """Every intact record with a position above ``after``, oldest first."""
        for segment in self._segments():
            for record in self._read_segment(segment):
                if record.position > after:
                    yield record

    def open(self, start_after: int = 0) -> None:
        """Repair a torn tail, then append after the last record (and after ``start_after``)."""
        last = 0
        for segment in self._segments():
            for record in self._read_segment(segment, repair=segment == self._segments()[-1]):
                last = max(last, record.position)
                self._last_of[record.model] = max(
                    self._last_of.get(record.model, 0), record.position
                )
        self.next_position = max(last, start_after) + 1
        self._start_segment()

    # writing -------------------------------------------------------------------------------
    def append(self, model: str, payload: bytes, content_type: str | None) -> int:
        """Buffer one record; durable only after ``commit``. Returns its position."""
        position = self.next_position
        model_bytes = model.encode()
        ct = (content_type or "").encode()
        body = b"".join(
            (
                _POSITION.pack(position, len(model_bytes)),
                model_bytes,
                _LENGTH.pack(len(ct)),
                ct,
                payload,
            )
        )
        record = _HEAD.pack(len(body), zlib.crc32(body)) + body
        with self._lock:
            if self._segment_size >= self.segment_bytes:
                self._roll()
            self._write(record)
            self._segment_size += len(record)
            self.next_position += 1
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
        """Flush and fsync everything appended so far (one fsync per group of appends)."""
        with self._lock:
            handle = self._file
            if handle is None:
                return
            handle.flush()  # type: ignore[attr-defined]
            if self.fsync:
                os.fsync(handle.fileno())  # type: ignore[attr-defined]

    def truncate(self, upto: int) -> int:
        """Delete segments holding only positions <= ``upto``; returns how many were deleted."""
        with self._lock:
            if self._segment_first <= upto and self._segment_size > 0:
                self._roll()
            removed = 0
            segments = self._segments()
            for current, following in itertools.pairwise(segments):
                if _first_position(following) - 1 <= upto:
                    current.unlink()
                    removed += 1
            return removed

    def close(self) -> None:
        self.commit()
        with self._lock:
            if self._file is not None:
                self._file.close()  # type: ignore[attr-defined]
                self._file = None

    # internals -----------------------------------------------------------------------------
    def _segments(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    def _start_segment(self) -> None:
        self._segment_first = self.next_position
        path = self.directory / f"{self._segment_first:020d}{SUFFIX}"
        self._file = path.open("ab")
        self._segment_size = path.stat().st_size

    def _roll(self) -> None:
        if self._file is not None:
            self._file.flush()  # type: ignore[attr-defined]
            if self.fsync:
                os.fsync(self._file.fileno())  # type: ignore[attr-defined]
            self._file.close()  # type: ignore[attr-defined]
        self._start_segment()

    def _write(self, record: bytes) -> None:
        assert self._file is not None, "open() the log before appending"
        self._file.write(record)  # type: ignore[attr-defined]

    def _read_segment(self, path: Path, repair: bool = False) -> Iterator[WalRecord]:
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            record, size = _parse(data, offset)
            if record is None:
                self._torn(path, offset, len(data), repair)
                return
            yield record
            offset += size

    def _torn(self, path: Path, offset: int, total: int, repair: bool) -> None:
        if repair:
            log.warning(
                "write-ahead log %s: cutting a torn record at byte %d of %d",
                path.name,
                offset,
                total,
            )
            with path.open("r+b") as handle:
                handle.truncate(offset)
        else:
            log.error(
                "write-ahead log %s: corrupt record at byte %d; rest of segment skipped",
                path.name,
                offset,
            )


def _parse(data: bytes, offset: int) -> tuple[WalRecord | None, int]:
    if offset + _HEAD.size > len(data):
        return None, 0
    length, crc = _HEAD.unpack_from(data, offset)
    start = offset + _HEAD.size
    body = data[start : start + length]
    if len(body) != length or zlib.crc32(body) != crc or length < _POSITION.size:
        return None, 0
    position, model_len = _POSITION.unpack_from(body, 0)
    cursor = _POSITION.size
    model = body[cursor : cursor + model_len].decode()
    cursor += model_len
    (ct_len,) = _LENGTH.unpack_from(body, cursor)
    cursor += _LENGTH.size
    content_type = body[cursor : cursor + ct_len].decode() or None
    cursor += ct_len
    return WalRecord(position, model, content_type, body[cursor:]), _HEAD.size + length


def _first_position(path: Path) -> int:
    return int(path.name.removesuffix(SUFFIX))
