"""The serving record (``wire.serving_record``): its canonical JSON round-trips, a move counts
up and forgets the payloads no longer named, the unversioned path's choice (pin, default
label, newest), and what a label or a record may not be."""

from __future__ import annotations

import json

import pytest

from livefit.server.wire.serving_record import (
    LATEST,
    RecordError,
    Rollback,
    ServingRecord,
    check_label,
)


def record() -> ServingRecord:
    return ServingRecord(
        "m", "abc", sequence=3, labels={"stable": 10, "canary": 12}, default="stable",
        versions={10: "a" * 64, 12: "b" * 64}, rollbacks=(Rollback(8, "train", 11, 1.5),),
    )  # fmt: skip


def test_the_json_is_canonical_and_round_trips() -> None:
    text = record().encode()
    assert ServingRecord.decode(text) == record()
    assert ServingRecord.decode(text).encode() == text
    assert " " not in text


def test_the_pin_wins_then_the_default_label_then_the_newest() -> None:
    assert record().served() == 10
    assert record().moved(1.0, pinned=12).served() == 12
    assert record().moved(1.0, default=LATEST).served() is None
    assert record().label_version(LATEST) is None
    with pytest.raises(KeyError):
        record().label_version("gone")


def test_the_guard_hold_serves_after_the_pin_before_the_default_and_round_trips() -> None:
    held = record().moved(1.0, guarded=9)
    assert held.served() == 9 and 9 in held.named()
    assert held.moved(2.0, pinned=12).served() == 12  # an operator's pin wins over the guard
    assert ServingRecord.decode(held.encode()) == held
    older = held.as_json()
    del older["guarded"]  # a record written before the guard existed
    assert ServingRecord.decode(json.dumps(older)).guarded is None


def test_a_move_counts_up_and_forgets_payloads_no_longer_named() -> None:
    after = record().moved(2.0, labels={"stable": 10}, default="stable")
    assert after.sequence == 4 and after.moved_at == 2.0
    assert dict(after.versions) == {10: "a" * 64}
    assert after.newer_than(record()) and not record().newer_than(after)
    assert ServingRecord("m", "other").newer_than(after)  # another lineage: taken


@pytest.mark.parametrize("name", ["", "latest", "a b", "é", "x" * 65, "../etc"])
def test_labels_an_operator_cannot_move(name: str) -> None:
    with pytest.raises(RecordError):
        check_label(name)


@pytest.mark.parametrize(
    "text",
    [
        "{}", "[]", "not json",
        record().encode().replace('"default":"stable"', '"default":"nowhere"'),
        record().encode().replace('"stable":10', '"stable":-1'),
        record().encode().replace('"stable":10', '"stable":true'),
    ],
)  # fmt: skip
def test_a_record_that_cannot_be_is_refused(text: str) -> None:
    with pytest.raises(RecordError):
        ServingRecord.decode(text)
