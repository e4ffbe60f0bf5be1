"""Checkpoints: atomic, checksummed, the newest K kept, falling back past a corrupt newest one."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from livefit.server.storage.checkpoint import Checkpoint, CheckpointStore


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


def test_no_checkpoint_and_high_water_mark(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "m")
    assert store.load_latest() is None and store.high_water_mark() == 0
    store.write_high_water_mark(42)
    assert CheckpointStore(tmp_path, "m").high_water_mark() == 42
