"""The learner's book of the serving record (``serve.version_book``): a version must be kept
to be named and is then held past the keep count; moves are durable (a new book on the same
directory serves by them); the pin wins; a rollback serves or trains on as the next version;
a failed move changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from livefit.server.config.model_tables import VersionsSettings
from livefit.server.serve.version_book import Move, MoveRefused, VersionBook
from livefit.server.serve.versions import KeptVersions
from livefit.server.storage.serving_record_file import ServingRecordFile
from livefit.server.weights.format import WeightsMeta, encode_weights
from livefit.server.wire.serving_record import MAX_LABELS, ServingRecord
from livefit.server.wire.snapshot import Snapshot, SnapshotSlot

LINEAGE = "L1"


def snapshot(version: int) -> Snapshot:
    weights = (np.full((2, 1), version, np.float32), np.zeros(1, np.float32))
    return Snapshot("m", version, weights, time.time(), version, lineage=LINEAGE)


def payload(s: Snapshot) -> bytes:
    meta = WeightsMeta("m", s.version, s.samples_seen, s.created_at, None, "fp", s.lineage)
    return encode_weights(["k", "b"], s.weights, meta)


class Book:
    """A book over a slot keeping 2 snapshots; ``announced`` records what was announced."""

    def __init__(self, directory: Path) -> None:
        self.slot = SnapshotSlot()
        self.versions = KeptVersions(
            "m", VersionsSettings(keep_snapshots=2), lambda: self.slot.latest
        )
        self.slot.subscribe(self.versions.add)
        self.announced: list[tuple[ServingRecord, dict[int, bytes], Move]] = []
        self.trained_on: list[int] = []
        self.book = VersionBook(
            "m", self.versions, ServingRecordFile(directory), payload, lambda: LINEAGE,
            lambda r, added, move: self.announced.append((r, added, move)), self.continue_from,
        )  # fmt: skip
        self.book.restore()

    def continue_from(self, source: Snapshot, timeout: float) -> int:
        self.trained_on.append(source.version)
        newest = self.slot.latest
        assert newest is not None
        after = Snapshot("m", newest.version + 1, source.weights, time.time(), 0, lineage=LINEAGE)
        self.slot.publish(after)
        return after.version


def test_a_label_holds_its_version_past_the_keep_count_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    one = Book(tmp_path)
    for version in (1, 2, 3):
        one.slot.publish(snapshot(version))
    with pytest.raises(MoveRefused) as refused:
        one.book.move(Move("label", "stable", 1))  # expired already
    assert refused.value.status == 404 and "kept: 2-3" in refused.value.message
    record = one.book.move(Move("label", "stable", 2))
    assert record.labels == {"stable": 2} and record.sequence == 1
    assert set(one.announced[-1][1]) == {2}  # the new payload went out
    for version in (4, 5, 6):
        one.slot.publish(snapshot(version))
    held = one.versions.labelled("stable")
    assert held is not None and held.version == 2 and float(held.weights[0][0, 0]) == 2.0
    two = Book(tmp_path)  # a restart: the newest only in memory
    two.slot.publish(snapshot(7))
    two.book.restore()
    again = two.versions.labelled("stable")
    assert again is not None and again.version == 2
    np.testing.assert_array_equal(again.weights[0], held.weights[0])


def test_the_pin_wins_and_unpin_serves_the_default_label(tmp_path: Path) -> None:
    b = Book(tmp_path)
    for version in (1, 2):
        b.slot.publish(snapshot(version))
    b.book.move(Move("label", "stable", 1))
    b.book.move(Move("default", "stable"))
    assert b.versions.served().version == 1  # type: ignore[union-attr]
    b.book.move(Move("pin"))  # unset: the version served now
    b.book.move(Move("default", "latest"))
    assert b.versions.served().version == 1  # type: ignore[union-attr]
    b.book.move(Move("pin", version=2))
    assert b.versions.served().version == 2  # type: ignore[union-attr]
    record = b.book.move(Move("unpin"))
    assert record.pinned is None and b.versions.served() is None  # the newest


def test_rollbacks_serve_or_train_on_as_the_next_version(tmp_path: Path) -> None:
    b = Book(tmp_path)
    for version in (1, 2):
        b.slot.publish(snapshot(version))
    served = b.book.move(Move("rollback", version=1, mode="serve"))
    assert served.pinned == 1 and served.rollbacks[-1].mode == "serve"
    trained = b.book.move(Move("rollback", version=1, mode="train"))
    assert b.trained_on == [1] and trained.pinned is None
    assert trained.rollbacks[-1].source == 1 and trained.rollbacks[-1].version == 3
    assert b.slot.latest is not None and b.slot.latest.version == 3


def test_a_refused_move_changes_nothing(tmp_path: Path) -> None:
    b = Book(tmp_path)
    b.slot.publish(snapshot(1))
    before = b.book.move(Move("label", "stable", 1))
    for move, status in ((Move("label", "latest", 1), 400), (Move("unlabel", "gone"), 404),
                         (Move("default", "gone"), 404), (Move("pin", version=99), 404),
                         (Move("rollback", version=1, mode="sideways"), 400)):  # fmt: skip
        with pytest.raises(MoveRefused) as refused:
            b.book.move(move)
        assert refused.value.status == status, move
    assert b.book.record() == before
    assert ServingRecordFile(tmp_path).load() == before


def test_labels_stop_at_what_a_record_may_hold(tmp_path: Path) -> None:
    """One label past ``MAX_LABELS`` would make a record that neither a receiver nor this book,
    restarted, reads (``ServingRecord.decode`` refuses it): refused, the record kept readable."""
    b = Book(tmp_path)
    b.slot.publish(snapshot(1))
    for n in range(MAX_LABELS):
        b.book.move(Move("label", f"l{n}", 1))
    with pytest.raises(MoveRefused) as refused:
        b.book.move(Move("label", "one-more", 1))
    assert refused.value.status == 409 and "remove one first" in refused.value.message
    b.book.move(Move("label", "l0", 1))  # moving one that exists is still fine
    loaded = ServingRecordFile(tmp_path).load()
    assert loaded is not None and len(loaded.labels) == MAX_LABELS


def test_the_guard_holds_apart_from_the_pin_which_wins_and_the_hold_survives_a_restart(
    tmp_path: Path,
) -> None:
    one = Book(tmp_path)
    for version in (1, 2):
        one.slot.publish(snapshot(version))
    record = one.book.move(Move("guard_hold", version=1))
    assert record.guarded == 1 and record.pinned is None and record.served() == 1
    served = one.versions.served()
    assert served is not None and served.version == 1
    assert one.announced[-1][2].action == "guard_hold" and set(one.announced[-1][1]) == {1}
    pinned = one.book.move(Move("pin", version=2))
    assert pinned.served() == 2 and pinned.guarded == 1  # the operator's pin wins
    one.book.move(Move("unpin"))
    for version in (3, 4, 5):
        one.slot.publish(snapshot(version))
    two = Book(tmp_path)
    two.slot.publish(snapshot(6))
    restored = two.book.restore()
    assert restored.guarded == 1 and restored.served() == 1
    released = two.book.move(Move("guard_release"))
    assert released.guarded is None and released.served() is None and 1 not in released.versions
