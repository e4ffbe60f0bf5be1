"""A model's serving record on disk (``storage.serving_record_file``): written whole and read
back, held payloads checked against the record's sha256, the released ones removed, and a
damaged record read as none."""

from __future__ import annotations

from pathlib import Path

from livefit.server.storage.serving_record_file import ServingRecordFile
from livefit.server.wire.serving_record import ServingRecord


def test_the_record_and_its_payloads_survive_and_released_ones_go(tmp_path: Path) -> None:
    file = ServingRecordFile(tmp_path / "m")
    assert file.load() is None
    sha_5 = file.save_held(5, b"five")
    sha_7 = file.save_held(7, b"seven")
    record = ServingRecord("m", "L", 1, labels={"a": 5, "b": 7}, versions={5: sha_5, 7: sha_7})
    file.save(record)
    again = ServingRecordFile(tmp_path / "m")
    assert again.load() == record
    assert again.load_held(5, sha_5) == b"five"
    assert again.load_held(5, sha_7) is None  # not the payload the record names
    file.save(record.moved(2.0, labels={"b": 7}))
    assert file.held_versions() == [7]
    assert not list((tmp_path / "m").glob("*.tmp"))


def test_a_damaged_record_is_none(tmp_path: Path) -> None:
    file = ServingRecordFile(tmp_path)
    (tmp_path / "serving.json").write_text('{"model": "m"')
    assert file.load() is None
