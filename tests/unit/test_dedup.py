"""De-duplication by (source, seq): duplicates dropped, out-of-order messages kept, gaps counted."""

from __future__ import annotations

from livefit.server.ingest.dedup import SequenceTracker


def feed(tracker: SequenceTracker, seqs: list[int], source: str = "s") -> list[int]:
    """The seqs accepted (not duplicates), committing after each one."""
    accepted = []
    for seq in seqs:
        if not tracker.check(source, seq):
            accepted.append(seq)
        tracker.commit()
    return accepted


def test_in_order_and_redelivered() -> None:
    tracker = SequenceTracker()
    assert feed(tracker, [1, 2, 3, 2, 3, 4]) == [1, 2, 3, 4]


def test_out_of_order_messages_are_not_duplicates() -> None:
    tracker = SequenceTracker()
    assert feed(tracker, [1, 2, 5, 6, 3, 4, 5, 7]) == [1, 2, 5, 6, 3, 4, 7]


def test_duplicates_within_one_group_before_commit() -> None:
    tracker = SequenceTracker()
    assert tracker.check("s", 1) is False
    assert tracker.check("s", 1) is True  # the broker resent it before the group committed
    tracker.commit()
    assert tracker.check("s", 1) is True


def test_uncommitted_messages_are_forgotten() -> None:
    tracker = SequenceTracker()
    assert tracker.check("s", 1) is False
    tracker.discard_pending()  # lost in a crash before the log commit
    assert tracker.check("s", 1) is False  # the redelivered message is accepted


def test_gaps_given_up_on_are_counted() -> None:
    tracker = SequenceTracker(max_out_of_order=3)
    feed(tracker, [1])
    gaps = 0
    for seq in (5, 6, 7, 8):
        tracker.check("s", seq)
        gaps += tracker.commit()
    assert gaps == 3  # 2, 3, 4 never came
    assert feed(tracker, [3, 9]) == [9]


def test_sources_are_independent_and_bounded() -> None:
    tracker = SequenceTracker(max_sources=2)
    feed(tracker, [1], "a")
    feed(tracker, [1], "b")
    feed(tracker, [1], "c")  # "a" is forgotten
    assert feed(tracker, [1], "a") == [1]
    assert feed(tracker, [1], "c") == []


def test_state_round_trip() -> None:
    tracker = SequenceTracker()
    feed(tracker, [1, 2, 4])
    restored = SequenceTracker()
    restored.loads(tracker.dumps())
    assert feed(restored, [1, 2, 3, 4, 5]) == [3, 5]


def test_missing_counts_numbers_not_received_yet_and_late_ones_fill_in() -> None:
    tracker = SequenceTracker()
    feed(tracker, [1, 2, 3, 7, 8])
    assert tracker.missing == 3  # 4, 5, 6
    feed(tracker, [5])
    assert tracker.missing == 2
    feed(tracker, [4, 6])
    assert tracker.missing == 0
    feed(tracker, [20], "other")
    feed(tracker, [25], "other")
    assert tracker.missing == 4


def test_missing_survives_a_checkpoint_and_drops_with_forgotten_sources() -> None:
    tracker = SequenceTracker(max_sources=1)
    feed(tracker, [1, 4])
    restored = SequenceTracker(max_sources=1)
    restored.loads(tracker.dumps())
    assert restored.missing == 2
    feed(restored, [1], "b")  # "s" is forgotten, with its missing numbers
    assert restored.missing == 0


def test_gaps_given_up_on_leave_nothing_missing() -> None:
    tracker = SequenceTracker(max_out_of_order=2)
    feed(tracker, [1, 5, 6, 7])
    assert tracker.missing == 0  # 2, 3, 4 were given up on (counted as gaps)
