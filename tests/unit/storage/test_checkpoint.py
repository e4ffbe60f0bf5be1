"""Checkpoints: atomic, checksummed (metadata included), the newest K kept, a corrupt newest one
set aside for the previous; notes not bounded by the safetensors header; format 1 still read;
a checkpoint failure of any kind is storage trouble."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from livefit.server.base.metrics import Metrics
from livefit.server.storage.checkpoint import Checkpoint, CheckpointStore
from livefit.server.storage.health import StorageHealth
from livefit.server.storage.metrics import StorageMetrics
from livefit.server.train.checkpoint_writer import CheckpointWriter


def checkpoint(version: int) -> Checkpoint:
    rng = np.random.default_rng(version)
    return Checkpoint(
        model="m",
        version=version,
        samples_seen=version * 10,
        position=version * 3,
        weights=[rng.normal(size=(4, 2)).astype(np.float32), np.zeros(2, np.float32)],
        optimizer=[np.array(version, np.int64), rng.normal(size=(4, 2)).astype(np.float32)],
        extra={"scaler_mean": np.ones(4)},
    )


def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "m")
    original = checkpoint(7)
    store.write(original)
    loaded = store.load_latest()
    assert loaded is not None
    assert (loaded.version, loaded.samples_seen, loaded.position) == (7, 70, 21)
    for a, b in zip(
        loaded.weights + loaded.optimizer, original.weights + original.optimizer, strict=True
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(loaded.extra["scaler_mean"], np.ones(4))


def test_keeps_the_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "m", keep=2)
    for version in (1, 2, 3, 4):
        store.write(checkpoint(version))
    assert [p.name for p in store.paths()] == [
        "ckpt-000000000004.safetensors",
        "ckpt-000000000003.safetensors",
    ]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_newest_falls_back_and_says_so(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, "m")
    store.write(checkpoint(1))
    newest = store.write(checkpoint(2))
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[-5] ^= 0xFF  # inside the tensor data: only the checksum can tell
        newest.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR):
        loaded = store.load_latest()
    assert loaded is not None and loaded.version == 1
    assert "falling back" in caplog.text and newest.name in caplog.text
    assert store.set_aside == [newest.with_name(newest.name + ".corrupt")]
    assert store.set_aside[0].exists() and not newest.exists()  # set aside, never read again


@pytest.mark.parametrize("field", ["position", "version", "samples_seen", "lineage", "model"])
def test_a_bit_flipped_in_the_metadata_fails_the_checksum(
    tmp_path: Path, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26 item 2: the log position 500 read as 700 restored silently (metadata was
    outside the checksum). One bit flipped in any metadata value is caught now."""
    store = CheckpointStore(tmp_path, "m")
    store.write(checkpoint(1))
    newest = store.write(replace(checkpoint(2), position=500, lineage="abc"))
    data = bytearray(newest.read_bytes())
    at = data.index(f'"{field}":"'.encode()) + len(field) + 4  # the value's first character
    data[at] ^= 0x02  # "500" -> "700", "2" -> "0", "20" -> "00", "abc" -> "cbc", "m" -> "o"
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR):
        loaded = store.load_latest()
    assert loaded is not None and loaded.version == 1
    assert "checksum mismatch" in caplog.text and len(store.set_aside) == 1


def test_notes_are_tensors_not_bounded_by_the_header(tmp_path: Path) -> None:
    """Issue 26 item 3: notes lived in the safetensors header (100,000,000 bytes at most);
    they are uint8 tensors now, covered by the checksum. 120 MB of notes round-trip."""
    store = CheckpointStore(tmp_path, "m")
    big = np.random.default_rng(0).integers(0, 256, 120_000_000, np.uint8).tobytes()
    store.write(replace(checkpoint(3), notes={"labels.msgpack": big, "dedup": b"{}"}))
    loaded = store.load_latest()
    assert loaded is not None and loaded.notes == {"labels.msgpack": big, "dedup": b"{}"}


def test_format_1_checkpoints_are_still_read(tmp_path: Path) -> None:
    """A checkpoint written before the checksum covered the metadata (notes in the header)."""
    original = checkpoint(5)
    tensors = {f"w:{i:04d}": a for i, a in enumerate(original.weights)}
    tensors.update({f"o:{i:04d}": a for i, a in enumerate(original.optimizer)})
    tensors.update({f"x:{k}": a for k, a in original.extra.items()})
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(tensors[key]).tobytes())
    metadata = {
        "model": "m", "version": "5", "samples_seen": "50", "position": "15",
        "created_at": "1.5", "lineage": "abc", "sha256": digest.hexdigest(),
        "note:dedup": json.dumps({"s": [1, []]}), "note:labels": "AAEC",
    }  # fmt: skip
    (tmp_path / "ckpt-000000000005.safetensors").write_bytes(st_save(tensors, metadata=metadata))
    loaded = CheckpointStore(tmp_path, "m").load_latest()
    assert loaded is not None
    assert (loaded.version, loaded.position, loaded.lineage) == (5, 15, "abc")
    assert loaded.notes == {"dedup": b'{"s": [1, []]}', "labels": b"AAEC"}


class _Failing(CheckpointStore):
    def write(self, checkpoint: Checkpoint) -> Path:
        raise ValueError("header too large")  # not an OSError: what safetensors raised


def test_any_checkpoint_failure_is_storage_trouble(tmp_path: Path) -> None:
    """Issue 26 item 3: a checkpoint failing with something other than OSError was only logged;
    readiness stayed 200 and livefit_storage_healthy 1. Now it fails the storage health until a
    checkpoint is written again."""
    metrics = Metrics()
    storage = StorageHealth(metrics)
    writer = CheckpointWriter("m", _Failing(tmp_path, "m"), metrics, storage)
    writer.write(checkpoint(1))
    assert not storage.healthy and metrics.group(StorageMetrics).storage_healthy._value.get() == 0
    assert "storage checkpoint failing" in storage.problems()[0]
    assert writer.failure is not None and "header too large" in writer.failure
    writer.store = CheckpointStore(tmp_path, "m")
    writer.write(checkpoint(2))
    assert (
        storage.healthy
        and metrics.group(StorageMetrics).storage_healthy._value.get() == 1
        and writer.failure is None
    )


def test_no_checkpoint_and_high_water_mark(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "m")
    assert store.load_latest() is None and store.high_water_mark() == 0
    store.write_high_water_mark(42)
    assert CheckpointStore(tmp_path, "m").high_water_mark() == 42
