"""The write-ahead log: round trips, positions across restarts, torn tails, damaged records,
a deleted directory, truncation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from livefit.server.storage.wal import StorageError, WriteAheadLog


def fill(wal: WriteAheadLog, n: int, model: str = "m") -> list[int]:
    positions = [
        wal.append(model, f"payload-{i}".encode() * 10, "application/json") for i in range(n)
    ]
    wal.commit()
    return positions


def test_round_trip_and_positions_continue_after_reopen(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open()
    first = fill(wal, 5)
    wal.close()
    again = WriteAheadLog(tmp_path)
    again.open()
    second = fill(again, 3, model="other")
    again.close()
    assert first == [1, 2, 3, 4, 5] and second == [6, 7, 8]
    records = list(WriteAheadLog(tmp_path).replay())
    assert [r.position for r in records] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert records[0].payload == b"payload-0" * 10 and records[0].content_type == "application/json"
    assert records[-1].model == "other"
    assert [r.position for r in WriteAheadLog(tmp_path).replay(after=6)] == [7, 8]


def test_start_after_keeps_positions_above_a_checkpoint(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open(start_after=100)
    assert fill(wal, 1) == [101]
    wal.close()


def test_torn_tail_is_cut_and_appending_resumes(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open()
    fill(wal, 3)
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])  # a crash in the middle of writing the third record
    reopened = WriteAheadLog(tmp_path)
    reopened.open()
    assert [r.position for r in reopened.replay()] == [1, 2]
    assert fill(reopened, 1) == [3]
    reopened.close()
    assert [r.position for r in WriteAheadLog(tmp_path).replay()] == [1, 2, 3]


def record_offsets(segment: Path) -> list[int]:
    """Byte offsets of the records of an intact segment (u32 length, u32 CRC, body)."""
    data, offsets, offset = segment.read_bytes(), [], 0
    while offset < len(data):
        offsets.append(offset)
        offset += 8 + int.from_bytes(data[offset : offset + 4], "little")
    return offsets


def damage(segment: Path, at: int, mask: int = 0x01) -> None:
    data = bytearray(segment.read_bytes())
    data[at] ^= mask
    segment.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_payload_skips_that_record_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open()
    fill(wal, 5)
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    offsets = record_offsets(segment)
    damage(segment, offsets[2] + 30)  # inside the third record's payload
    reopened = WriteAheadLog(tmp_path)
    reopened.open()  # the newest segment: a damaged record with intact ones after it is no tail
    assert [r.position for r in reopened.replay()] == [1, 2, 4, 5]
    assert [(s.offset, s.records, s.after) for s in reopened.skipped] == [(offsets[2], 1, 2)]
    assert f"skipped a corrupt record at byte {offsets[2]}" in caplog.text
    assert "cutting" not in caplog.text
    assert fill(reopened, 1) == [6]
    reopened.close()
    assert [r.position for r in WriteAheadLog(tmp_path).replay()] == [1, 2, 4, 5, 6]


@pytest.mark.parametrize("length_byte", [0, 1, 3])
def test_a_corrupt_length_field_is_resynced_past(tmp_path: Path, length_byte: int) -> None:
    """The length itself is damaged (shorter, longer, absurd): the reader scans for the next
    record whose position and CRC hold."""
    wal = WriteAheadLog(tmp_path)
    wal.open()
    fill(wal, 6)
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    offsets = record_offsets(segment)
    damage(segment, offsets[3] + length_byte, 0x40)
    reopened = WriteAheadLog(tmp_path)
    reopened.open()
    assert [r.position for r in reopened.replay()] == [1, 2, 3, 5, 6]
    assert [(s.offset, s.size, s.records) for s in reopened.skipped] == [
        (offsets[3], offsets[4] - offsets[3], 1)
    ]
    reopened.close()


def test_a_zeroed_block_over_several_records_counts_each(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open()
    fill(wal, 10)
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    offsets = record_offsets(segment)
    data = bytearray(segment.read_bytes())
    data[offsets[2] : offsets[5] + 10] = bytes(offsets[5] + 10 - offsets[2])
    segment.write_bytes(bytes(data))
    wal = WriteAheadLog(tmp_path)
    assert [r.position for r in wal.replay()] == [1, 2, 7, 8, 9, 10]
    assert [(s.offset, s.size, s.records) for s in wal.skipped] == [
        (offsets[2], offsets[6] - offsets[2], 4)
    ]


def test_a_damaged_last_record_is_still_a_torn_tail_and_cut(tmp_path: Path) -> None:
    """Nothing intact after it: a crash mid-write, cut on open (not counted as skipped), while
    a damaged record before it is skipped."""
    wal = WriteAheadLog(tmp_path)
    wal.open()
    fill(wal, 4)
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    offsets = record_offsets(segment)
    damage(segment, offsets[1] + 20)
    damage(segment, offsets[3] + 20)
    reopened = WriteAheadLog(tmp_path)
    reopened.open()
    assert segment.stat().st_size == offsets[3]
    assert [r.position for r in reopened.replay()] == [1, 3]
    assert [s.offset for s in reopened.skipped] == [offsets[1]]
    reopened.close()


def test_a_damaged_record_in_an_older_segment_skips_only_itself(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=500)
    wal.open()
    fill(wal, 20)
    wal.close()
    oldest = sorted(tmp_path.glob("*.wal"))[0]
    offsets = record_offsets(oldest)
    assert len(offsets) >= 3
    damage(oldest, offsets[1] + 25)
    assert [r.position for r in WriteAheadLog(tmp_path).replay()] == [1, *range(3, 21)]


@pytest.mark.parametrize("where", ["payload", "length"])
def test_a_damaged_last_record_of_a_closed_segment_is_skipped_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """Only the newest segment can end in a torn write: a closed segment's damaged last record
    was lost to damage (an outside attack on issue 26 item 1 found it skipped, logged twice per
    start as "rest of segment skipped" and not counted). Now it is one skipped record, counted
    up to the next segment's first position, logged once; the next segments replay."""
    wal = WriteAheadLog(tmp_path, segment_bytes=500)
    wal.open()
    fill(wal, 20)
    wal.close()
    oldest, second = sorted(tmp_path.glob("*.wal"))[:2]
    offsets = record_offsets(oldest)
    last = len(offsets)  # the oldest segment holds positions 1 .. last
    assert int(second.name.split(".")[0]) == last + 1
    damage(oldest, offsets[-1] + (25 if where == "payload" else 1), 0x40)
    reopened = WriteAheadLog(tmp_path)
    reopened.open()
    assert [r.position for r in reopened.replay()] == [*range(1, last), *range(last + 1, 21)]
    assert [(s.segment, s.offset, s.records, s.after) for s in reopened.skipped] == [
        (oldest.name, offsets[-1], 1, last - 1)
    ]
    assert caplog.text.count(f"skipped a corrupt record at byte {offsets[-1]}") == 1
    assert "rest of segment skipped" not in caplog.text and "cutting" not in caplog.text
    assert oldest.stat().st_size == len(oldest.read_bytes())  # a closed segment is never cut
    reopened.close()


def test_a_deleted_directory_refuses_every_later_group(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    wal = WriteAheadLog(directory)
    wal.open()
    assert wal.write_group([("m", b"x", None)]) == [1]
    shutil.rmtree(directory)
    with pytest.raises(StorageError) as refused:
        wal.write_group([("m", b"y", None)])  # its segment is unlinked: not durable
    assert refused.value.op == "storage_lost" and "deleted" in str(wal.lost)
    directory.mkdir()  # a directory at the same path is not the one the log opened
    with pytest.raises(StorageError):
        wal.write_group([("m", b"z", None)])
    assert wal.truncate(10) == 0 and list(directory.iterdir()) == []
    wal.close()


def test_a_replaced_directory_is_noticed_before_anything_is_written(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    wal = WriteAheadLog(directory)
    wal.open()
    directory.rename(tmp_path / "moved")
    directory.mkdir()
    with pytest.raises(StorageError) as refused:
        wal.write_group([("m", b"x", None)])
    assert "replaced" in str(refused.value)
    wal.close()


@pytest.mark.parametrize("upto", [0, 10, 25, 40])
def test_truncate_removes_only_segments_wholly_at_or_before(tmp_path: Path, upto: int) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    wal.open()
    fill(wal, 40)
    wal.truncate(upto)
    remaining = [r.position for r in wal.replay()]
    assert set(range(upto + 1, 41)) <= set(remaining)  # nothing past the checkpoint is lost
    assert len(remaining) < 40 or upto == 0
    assert fill(wal, 1) == [41]
    wal.close()
