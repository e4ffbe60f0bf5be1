"""The join store and label wire format, without processes: joins in both orders, expiry by
time and by count under both policies, duplicates, and a replay of the same events from a
saved state giving the same samples (the determinism restart relies on); expiry by the
learner's arrival times, whatever a record's serving time says; rows with NaN left out of a
records message."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from livefit.server.labels.store import JoinStore, Policy, Shapes
from livefit.server.wire.codec import SampleSpec
from livefit.server.wire.label_ids import IdError, check_ids
from livefit.server.wire.labels import (
    PredictionBatch,
    decode_labels,
    decode_predictions,
    encode_predictions,
)
from livefit.server.wire.rejection import Rejection

SPEC = SampleSpec(input_shape=(2,), target_shape=(1,))
SHAPES = Shapes(input=(2,), output=(1,), target=(1,))


def predictions(ids: list, t: float = 100.0) -> PredictionBatch:
    n = len(ids)
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    return PredictionBatch(ids, x, np.full((n, 1), 0.5, np.float32), [7] * n, [t] * n)


def labels(ids: list, y: float = 1.0):
    body = {"id": ids, "y": [[y]] * len(ids)} if isinstance(ids, list) else {"id": ids, "y": [y]}
    return decode_labels(json.dumps(body).encode(), SPEC)


def store(**policy) -> JoinStore:
    settings = {"ttl_s": 10.0, "max_pending": 100} | policy
    return JoinStore(SHAPES, Policy(**settings))


def test_joins_in_both_orders() -> None:
    s = store()
    assert s.add_predictions(predictions(["a", 1]), 100.0, 1).chunk is None
    first = s.add_labels(labels(["a"]), 101.0, 2)
    assert first.outcomes == {"joined": 1} and first.chunk is not None
    assert first.chunk.x.tolist() == [[0.0, 1.0]] and first.chunk.position == 2
    assert first.delays == [1.0]
    early = s.add_labels(labels(["b"]), 101.0, 3)  # before its prediction
    assert early.chunk is None and len(s.early) == 1
    later = s.add_predictions(predictions(["b"]), 100.0, 4)
    assert later.outcomes == {"joined": 1} and later.chunk is not None
    again = s.add_labels(labels(["a", "b"]), 102.0, 5)
    assert again.outcomes == {"duplicate": 2} and again.chunk is None
    assert "i:1" in s.pending and "s:1" not in s.pending  # 1 and "1" are different ids


@pytest.mark.parametrize("on_expiry", ["drop", "default"])
def test_expiry_by_count_and_time(on_expiry: str) -> None:
    default = np.array([0.0], np.float32) if on_expiry == "default" else None
    s = store(max_pending=2, on_expiry=on_expiry, default_y=default)
    by_count = s.add_predictions(predictions(["a", "b", "c"]), 100.0, 1)
    assert by_count.outcomes == {"expired": 1} and list(s.pending) == ["s:b", "s:c"]
    assert (by_count.chunk is not None) == (on_expiry == "default")
    assert not s.due(105.0) and s.due(110.0)
    by_time = s.tick(110.0, 2)
    assert by_time.outcomes == {"expired": 2} and not s.pending
    if on_expiry == "default":
        assert by_time.chunk is not None and by_time.chunk.y.tolist() == [[0.0], [0.0]]
    late = s.add_labels(labels(["a"]), 111.0, 3)
    assert late.outcomes == {"late": 1}


def test_a_future_dated_record_neither_stops_expiry_nor_dates_a_delay() -> None:
    """Issue 45 item 4: the record with ``t = 1e11`` came first and every record behind it
    waited for it to expire."""
    s = store()
    liar = s.add_predictions(predictions(["liar"], t=1e11), 100.0, 1)
    assert liar.ahead == [1e11 - 100.0]
    s.add_predictions(predictions(["a", "b"], t=104.0), 105.0, 2)
    assert s.due(110.0) and s.tick(110.0, 3).outcomes == {"expired": 1}
    assert list(s.pending) == ["s:a", "s:b"]
    assert s.tick(115.0, 4).outcomes == {"expired": 2} and not s.pending
    joined = store()
    joined.add_predictions(predictions(["x"], t=1e11), 100.0, 1)
    assert joined.add_labels(labels(["x"]), 103.0, 2).delays == [3.0]  # from its arrival


def test_expiry_counts_from_arrival_not_from_a_serving_clock() -> None:
    """A serving process whose clock is an hour behind: its record still gets its TTL."""
    s = store()
    s.add_predictions(predictions(["slow"], t=100.0 - 3600), 100.0, 1)
    assert not s.due(105.0) and s.tick(105.0, 2).outcomes == {}
    assert s.tick(110.0, 3).outcomes == {"expired": 1}


def test_times_never_go_back_in_log_order() -> None:
    """An event stamped before the newest one applied counts as arriving with it, so an
    earlier tick expires nothing new and insertion order stays time order."""
    s = store()
    s.add_predictions(predictions(["a"]), 200.0, 1)
    s.add_predictions(predictions(["b"]), 150.0, 2)  # stamped earlier: counts as 200
    assert s.now == 200.0 and s.pending["s:b"].arrived == 200.0
    assert s.tick(205.0, 3).outcomes == {} and s.now == 205.0
    assert s.tick(100.0, 4).outcomes == {} and s.now == 205.0
    assert s.tick(210.0, 5).outcomes == {"expired": 2}


def test_state_saved_before_arrival_times_loads() -> None:
    s = store()
    s.add_predictions(predictions(["a", "b"]), 100.0, 1)
    old = msgpack.unpackb(s.dumps(), raw=False)
    old["pending"] = [row[:3] for row in old["pending"]]  # [id, version, t], no arrival
    del old["now"]
    restored = store()
    restored.loads(msgpack.packb(old, use_bin_type=True))
    assert [r.arrived for r in restored.pending.values()] == [100.0, 100.0]
    assert restored.tick(110.0, 2).outcomes == {"expired": 2}


def test_early_labels_expire_as_unknown_ids() -> None:
    s = store(max_pending=1)
    assert s.add_labels(labels(["x", "y"]), 50.0, 1).outcomes == {"unknown_id": 1}
    assert s.tick(60.0, 2).outcomes == {"unknown_id": 1} and not s.early


def test_replay_from_saved_state_gives_the_same_samples() -> None:
    """Save after some events (samples made but untrained included), replay the rest."""
    events = [
        ("p", predictions(["a", "b", "c", "d"]), 1),
        ("l", labels(["a"]), 2),
        ("l", labels(["zz"]), 3),
        ("p", predictions(["zz"]), 4),
        ("l", labels(["b", "c"]), 5),
        ("t", 200.0, 6),
    ]

    def run(s: JoinStore, chosen) -> list:
        made = []
        for kind, value, position in chosen:
            if kind == "p":
                applied = s.add_predictions(value, 100.0, position)
            elif kind == "l":
                applied = s.add_labels(value, 101.0, position)
            else:
                applied = s.tick(value, position)
            if applied.chunk is not None:
                made.append((position, applied.chunk.x.tolist(), applied.chunk.y.tolist()))
        return made

    whole = run(store(on_expiry="default", default_y=np.array([9.0], np.float32)), events)
    first = store(on_expiry="default", default_y=np.array([9.0], np.float32))
    head = run(first, events[:4])
    first.trained_through(2)  # the trainer has the sample of position 2, not that of 4
    saved = first.dumps()
    second = store(on_expiry="default", default_y=np.array([9.0], np.float32))
    second.loads(saved)
    assert [c.position for c in second.unsent] == [4]
    resent = [(c.position, c.x.tolist(), c.y.tolist()) for c in second.unsent]
    assert head[:1] + resent + run(second, events[4:]) == whole
    assert whole[-1][2] == [[9.0]]  # "d" expired into its default label


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"id": "a"}', "bad_schema"),
        (b'{"id": true, "y": [1]}', "bad_schema"),
        (b'{"id": ["a", "a"], "y": [[1], [2]]}', "bad_schema"),
        (b'{"id": ["a", "b"], "y": [[1]]}', "length_mismatch"),
        (b'{"id": [], "y": []}', "bad_shape"),
        (b'{"id": "a", "y": [NaN]}', "non_finite"),
        (b'{"id": "a", "y": [1], "w": -1}', "bad_weight"),
        (b'{"id": "' + b"x" * 300 + b'", "y": [1]}', "bad_schema"),
        (b'{"id": 99999999999999999999999, "y": [1]}', "bad_schema"),
        (b"\xff\x00", "undecodable"),
    ],
)
def test_bad_labels_are_rejected_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(Rejection) as caught:
        decode_labels(body, SPEC)
    assert caught.value.reason == reason


def test_prediction_records_round_trip() -> None:
    x = np.ones((2, 2), np.float32)
    payload = encode_predictions(["a", 5], x, np.zeros((2, 1)), [3, 4], [1.0, 2.0], "replica-1")
    batch = decode_predictions(payload, SPEC, (1,), "application/msgpack")
    assert batch.ids == ["a", 5] and batch.version == [3, 4] and batch.x.tolist() == x.tolist()
    with pytest.raises(Rejection):
        decode_predictions(payload, SampleSpec(input_shape=(3,), target_shape=(1,)), (1,), None)


def test_a_non_finite_row_costs_a_records_message_only_itself() -> None:
    x = np.ones((3, 2), np.float32)
    p = np.array([[0.5], [np.nan], [np.inf]], np.float32)
    payload = encode_predictions(["a", "b", "c"], x, p, [3, 4, 5], [1.0, 2.0, 3.0], "replica-1")
    batch = decode_predictions(payload, SPEC, (1,), "application/msgpack")
    assert batch.ids == ["a"] and batch.version == [3] and batch.t == [1.0]
    assert batch.non_finite == 2 and batch.x.shape == (1, 2) and batch.p.shape == (1, 1)
    x[0, 1] = np.nan
    only_bad = encode_predictions(["a", "b"], x[:2], p[:2], [3, 4], [1.0, 2.0], "replica-1")
    with pytest.raises(Rejection) as caught:
        decode_predictions(only_bad, SPEC, (1,), "application/msgpack")
    assert caught.value.reason == "non_finite"


def test_ids_are_checked() -> None:
    assert check_ids(["a", 2], 2) == ["a", 2]
    for bad in (["a"], ["a", "a"], [1.5, 2], "ab", [None, 1], [True, 1]):
        with pytest.raises(IdError):
            check_ids(bad, 2)
