"""The serving record in the kept versions (``serve.versions``, ``KeptVersions.apply``): what a
replica holds as the record and the named payloads arrive in any order. A named version is
listed as kept while it is held; a payload before its record waits for it; a payload whose
sha256 is not the record's is not served; a named version that comes by the stream after its
record is held; an older record moves nothing back."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.server.config.model_tables import VersionsSettings
from livefit.server.serve.versions import KeptVersions, VersionNotHere
from livefit.server.weights.format import WeightsMeta, encode_weights, sha256_hex
from livefit.server.wire.serving_record import ServingRecord
from livefit.server.wire.snapshot import Snapshot, SnapshotSlot

LINEAGE = "L1"


def snapshot(version: int) -> Snapshot:
    weights = (np.full((2, 1), version, np.float32), np.zeros(1, np.float32))
    return Snapshot("m", version, weights, 1000.0 + version, version, lineage=LINEAGE)


def payload(version: int) -> bytes:
    s = snapshot(version)
    meta = WeightsMeta("m", s.version, s.samples_seen, s.created_at, None, "fp", s.lineage)
    return encode_weights(["k", "b"], s.weights, meta)


def replica() -> tuple[SnapshotSlot, KeptVersions]:
    """A replica's kept versions: one snapshot, no checkpoints, no file of held payloads."""
    slot = SnapshotSlot()
    versions = KeptVersions("m", VersionsSettings(keep_snapshots=1), lambda: slot.latest)
    slot.subscribe(versions.add)
    return slot, versions


def pinned(version: int, sequence: int, sha256: str | None = None, **labels: int) -> ServingRecord:
    named = {version, *labels.values()}
    hashes = {v: sha256 or sha256_hex(payload(v)) for v in named}
    return ServingRecord("m", LINEAGE, sequence, labels=labels, pinned=version, versions=hashes)


def test_a_held_version_is_listed_as_kept_past_the_count() -> None:
    slot, versions = replica()
    for version in (1, 2):
        slot.publish(snapshot(version))
    versions.held_arrived(1, payload(1))
    assert versions.apply(pinned(1, 1))
    for version in (3, 4):
        slot.publish(snapshot(version))
    assert versions.versions().snapshots == (4, 1)
    held = versions.served()
    assert held is not None and held.version == 1 and versions.get(1) is held


def test_a_payload_before_its_record_waits_for_it_and_one_after_is_taken() -> None:
    slot, versions = replica()
    slot.publish(snapshot(5))
    versions.held_arrived(2, payload(2))
    assert versions.apply(pinned(2, 1, stable=3))
    assert versions.missing() == [3]
    with pytest.raises(VersionNotHere, match="label 'stable'"):
        versions.labelled("stable")
    versions.held_arrived(3, payload(3))
    assert versions.missing() == []
    labelled, served = versions.labelled("stable"), versions.served()
    assert labelled is not None and served is not None
    assert (labelled.version, served.version) == (3, 2)
    np.testing.assert_array_equal(served.weights[0], snapshot(2).weights[0])


def test_a_payload_the_record_does_not_vouch_for_is_not_served() -> None:
    slot, versions = replica()
    slot.publish(snapshot(5))
    versions.apply(pinned(2, 1, sha256="0" * 64))
    versions.held_arrived(2, payload(2))
    assert versions.missing() == [2]
    with pytest.raises(VersionNotHere):
        versions.served()


def test_a_named_version_that_comes_by_the_stream_after_its_record_is_held() -> None:
    """The replica takes the record before the weights it came with: a pin to the version
    that envelope carries is in force, and held, once the version arrives."""
    slot, versions = replica()
    slot.publish(snapshot(5))
    versions.apply(pinned(6, 1))
    assert versions.missing() == [6]
    slot.publish(snapshot(6))
    slot.publish(snapshot(7))  # past the keep count of 1
    served = versions.served()
    assert served is not None and served.version == 6 and versions.missing() == []


def test_an_older_record_moves_nothing_back() -> None:
    slot, versions = replica()
    for version in (1, 2):
        slot.publish(snapshot(version))
    assert versions.apply(pinned(2, 4))
    assert not versions.apply(pinned(1, 3))
    assert not versions.apply(pinned(1, 4))
    served = versions.served()
    assert served is not None and served.version == 2
