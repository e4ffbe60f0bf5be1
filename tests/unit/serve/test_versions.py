"""The past versions serving keeps (``serve.versions``): the newest snapshots within a count and
a byte budget (the newest always), one lineage at a time, checkpoints on disk read when asked
for (their served weights, never another lineage's), and a 404 text naming what is kept."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from livefit.server.config.model_tables import VersionsSettings
from livefit.server.serve.versions import (
    CheckpointShelf,
    KeptList,
    KeptVersions,
    VersionNotKept,
)
from livefit.server.storage import checkpoint as checkpoint_module
from livefit.server.storage.checkpoint import Checkpoint, CheckpointStore
from livefit.server.wire.snapshot import Snapshot, SnapshotSlot


def snapshot(version: int, lineage: str = "a", floats: int = 4) -> Snapshot:
    weights = (np.full(floats, version, dtype=np.float32),)
    return Snapshot("m", version, weights, 0.0, version, lineage=lineage)


def kept(
    keep: int = 3, keep_bytes: int = 10**6, shelf: CheckpointShelf | None = None
) -> tuple[SnapshotSlot, KeptVersions]:
    slot = SnapshotSlot()
    versions = KeptVersions("m", VersionsSettings(keep_snapshots=keep, keep_bytes=keep_bytes),
                            lambda: slot.latest, shelf)  # fmt: skip
    slot.subscribe(versions.add)
    return slot, versions


def test_the_newest_snapshots_are_kept_by_count() -> None:
    slot, versions = kept(keep=3)
    for v in (1, 4, 6, 9):
        slot.publish(snapshot(v))
    assert versions.versions() == KeptList((9, 6, 4), ())
    assert versions.get(1) is None
    found = versions.get(4)
    assert found is not None and found.version == 4 and float(found.weights[0][0]) == 4.0
    assert versions.kept_bytes == 3 * 16


def test_the_byte_budget_drops_the_oldest_but_never_the_newest() -> None:
    slot, versions = kept(keep=100, keep_bytes=40)  # two snapshots of 16 bytes fit
    for v in (1, 2, 3):
        slot.publish(snapshot(v))
    assert versions.versions().snapshots == (3, 2)
    slot.publish(snapshot(4, floats=1000))  # 4000 bytes: over the budget alone, still kept
    assert versions.versions().snapshots == (4,)
    assert versions.kept_bytes == 4000


def test_another_lineage_replaces_every_kept_version() -> None:
    slot, versions = kept()
    slot.publish(snapshot(5))
    slot.publish(snapshot(7))
    slot.publish(snapshot(2, lineage="b"))
    assert versions.versions().snapshots == (2,)
    assert versions.get(5) is None  # never another history's version 5


def test_the_current_snapshot_is_kept_before_its_listener_ran() -> None:
    """A request for the version just published finds it, whatever the listeners' order."""
    current = snapshot(8)
    versions = KeptVersions("m", VersionsSettings(), lambda: current)
    assert versions.get(8) is current
    assert versions.versions().snapshots == (8,)


def test_a_version_not_kept_is_an_error_naming_the_kept_ones_compactly() -> None:
    slot, versions = kept(keep=100)
    for v in [*range(10, 14), 20, *range(30, 60, 2)]:
        slot.publish(snapshot(v))
    with pytest.raises(VersionNotKept) as info:
        versions.load(3)
    message = str(info.value)
    assert message.startswith("version 3 of model m is not kept (expired, or never made); kept: ")
    assert (
        "10-13, 20, 30, 32, 34, 36, ... 5 more ..., 48, 50, 52, 54, 56, 58 (recent snapshots)"
        in (message)
    )


def test_a_checkpoint_serves_its_served_weights_while_on_disk(tmp_path: Path) -> None:
    """A checkpoint whose served weights differ from its trained ones (the weight average)
    serves the served ones; a pruned checkpoint is no longer kept, cached or not."""
    store = CheckpointStore(tmp_path / "m", "m", keep=2)
    lineage = store.lineage()
    served = snapshot(3, lineage=lineage)
    trained = [np.zeros(4, dtype=np.float32)]
    store.write(Checkpoint.from_snapshot(served, position=0, optimizer=[], trained=trained))
    slot, versions = kept(shelf=CheckpointShelf(tmp_path / "m"))
    slot.publish(snapshot(10, lineage=lineage))
    assert versions.versions() == KeptList((10,), (3,))
    assert versions.get(3) is None and versions.on_disk(3)  # not read yet
    loaded = versions.load(3)
    np.testing.assert_array_equal(loaded.weights[0], served.weights[0])
    assert (loaded.version, loaded.lineage) == (3, lineage)
    assert versions.get(3) is loaded  # read once, then held
    for v in (4, 5):  # keep = 2: checkpoint 3 is pruned
        store.write(Checkpoint.from_snapshot(snapshot(v, lineage), position=0, optimizer=[]))
    assert versions.versions().checkpoints == (5, 4)
    assert versions.get(3) is None and not versions.has(3)
    with pytest.raises(VersionNotKept):
        versions.load(3)


def test_checkpoints_of_another_lineage_or_without_served_weights_are_not_served(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path / "m", "m", keep=3)
    lineage = store.lineage()
    store.write(Checkpoint.from_snapshot(snapshot(3, lineage), position=0, optimizer=[]))
    slot, versions = kept(shelf=CheckpointShelf(tmp_path / "m"))
    slot.publish(snapshot(10, lineage="other"))
    assert versions.versions().checkpoints == ()
    assert not versions.has(3)
    slot.publish(snapshot(11, lineage=lineage))
    assert versions.has(3)
    # A checkpoint written before the served weights were recorded: not served.
    old = Checkpoint(model="m", version=4, samples_seen=0, position=0, weights=[np.ones(4)],
                     optimizer=[], lineage=lineage)  # fmt: skip
    path = store.write(old)
    _strip_served_metadata(path)
    assert CheckpointStore(tmp_path / "m", "m").load(path).served_weights is None
    with pytest.raises(VersionNotKept):
        versions.load(4)


def _strip_served_metadata(path: Path) -> None:
    """Rewrite a checkpoint as one written before ``served`` was recorded (checksum redone)."""
    tensors = load_file(str(path))
    raw = path.read_bytes()
    meta = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]
    del meta["served"], meta["checksum"]
    meta["checksum"] = checkpoint_module._checksum(meta, tensors)
    save_file(tensors, str(path), metadata=meta)
