"""De-duplication by (source, seq): duplicates dropped, out-of-order messages kept, gaps counted."""

from __future__ import annotations

from livefit.server.ingest.dedup import Restart, SequenceTracker, Verdict


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


def test_a_new_epoch_numbers_anew_and_is_reported_once() -> None:
    """Issue 45 item 9: a publisher numbering from 0 again lost every message up to its old
    highest number. With an epoch per run, the new run is new."""
    tracker = SequenceTracker()
    assert [tracker.judge("s", seq, epoch=1).restart for seq in range(5)] == [None] * 5
    tracker.commit()
    first = tracker.judge("s", 0, epoch=2)
    assert not first.duplicate and first.restart == Restart("epoch", "s", 0, 2, None)
    assert [tracker.check("s", seq, epoch=2) for seq in range(1, 8)] == [False] * 7
    tracker.commit()
    assert tracker.judge("s", 8, epoch=2).restart is None
    # a late redelivery of the first run is still a duplicate, and no restart
    assert tracker.judge("s", 3, epoch=1) == Verdict(True)


def test_a_restart_without_an_epoch_is_suspected_once_per_episode() -> None:
    tracker = SequenceTracker(max_out_of_order=100)
    assert feed(tracker, list(range(50))) == list(range(50))
    redelivered = tracker.judge("s", 48)  # near the newest: a redelivery
    assert redelivered == Verdict(True)
    back = tracker.judge("s", 0)
    assert back.duplicate and back.restart == Restart("seq", "s", 0, None, 49)
    assert [tracker.judge("s", seq) for seq in range(1, 50)] == [Verdict(True)] * 49
    tracker.commit()
    assert feed(tracker, [50]) == [50]  # a new number ends the episode
    assert tracker.judge("s", 0).restart is not None


def test_far_below_the_newest_is_suspected_too() -> None:
    tracker = SequenceTracker(max_out_of_order=10)
    feed(tracker, [1000])  # first seen mid-stream: its first number is 1000
    feed(tracker, list(range(1001, 1100)))
    assert tracker.judge("s", 1095).restart is None
    assert tracker.judge("s", 1050).restart == Restart("seq", "s", 1050, None, 1099)


def test_epochs_round_trip_and_the_old_format_loads() -> None:
    tracker = SequenceTracker()
    for epoch in (None, 1, 2):
        for seq in (1, 2, 4):
            tracker.check("s", seq, epoch)
        tracker.commit()
    restored = SequenceTracker()
    restored.loads(tracker.dumps())
    assert restored.judge("s", 5, epoch=2).restart is None  # 2 is the newest epoch
    assert restored.judge("s", 0, epoch=3).restart == Restart("epoch", "s", 0, 3, None)
    # the first number is saved too: going back to it is suspected
    assert restored.judge("s", 1, epoch=None).restart == Restart("seq", "s", 1, None, 4)
    held = [(seq, epoch) for epoch in (None, 1, 2) for seq in (1, 2, 3, 4)]
    assert [restored.check("s", seq, epoch) for seq, epoch in held] == [True, True, False, True] * 3
    old = SequenceTracker()
    old.loads('{"s": [2, [4]]}')  # {source: [low, above]}, before epochs
    assert [old.check("s", seq) for seq in (1, 2, 3, 4, 5)] == [True, True, False, True, False]
    assert old.missing == 1
