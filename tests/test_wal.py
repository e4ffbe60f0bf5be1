"""The write-ahead log: round trips, positions across restarts, torn tails, truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

from livefit.server.ingestion.wal import WriteAheadLog


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


def test_flipped_byte_is_detected(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open()
    fill(wal, 3)
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    positions = [r.position for r in WriteAheadLog(tmp_path).replay()]
    assert positions == [
        1
    ]  # the damaged record and what follows it in that segment are not replayed


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
