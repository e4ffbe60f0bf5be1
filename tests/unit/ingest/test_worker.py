"""The ingest worker with the real decoder, log, queue and sequence tracker; only the broker
connection is a recorder (the broker-level versions of these are in test_hardening.py).

Every message ends acknowledged exactly once, whatever it contains; a log that cannot store a
group leaves no trace in the dedup state and acknowledges nothing until it can; a model whose
queue nobody drains reports itself stalled.
"""

from __future__ import annotations

import errno
import json
import queue
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livefit.server.base.metrics import Metrics
from livefit.server.ingest.dedup import SequenceTracker
from livefit.server.ingest.route import Route
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.ingest.worker import IngestWorker
from livefit.server.mqtt.connection import RawMessage
from livefit.server.storage.health import StorageHealth
from livefit.server.storage.wal import WriteAheadLog
from livefit.server.wire.codec import SampleSpec

TOPIC = "livefit/m/samples"


class RecordingConnection:
    """What the worker needs of an MQTT connection: an inbox, acks and publishes, recorded."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[RawMessage] = queue.Queue()
        self.acks: list[int] = []
        self.published: list[tuple[str, bytes]] = []

    def ack(self, message: RawMessage) -> None:
        self.acks.append(message.mid)

    def publish(self, topic: str, payload: bytes, **_: object) -> None:
        self.published.append((topic, payload))


def worker_for(
    tmp: Path | None, capacity: int = 100_000, dedup: bool = True, stall_after_s: float = 30.0
) -> tuple[IngestWorker, RecordingConnection, SampleQueue, Metrics]:
    metrics = Metrics()
    connection = RecordingConnection()
    samples = SampleQueue(capacity)
    route = Route(
        model="m",
        subscription=TOPIC,
        spec=SampleSpec(input_shape=(2,), target_shape=(1,)),
        queue=samples,
        dead_letter_topic="livefit/m/rejected",
        sequences=SequenceTracker(),
        drop_duplicates=dedup,
    )
    wal = None
    if tmp is not None:
        wal = WriteAheadLog(tmp / "wal")
        wal.open()
    worker = IngestWorker(
        connection,  # type: ignore[arg-type]
        route, metrics, wal, storage=StorageHealth(metrics), stall_after_s=stall_after_s,
    )  # fmt: skip
    return worker, connection, samples, metrics


def message(mid: int, payload: bytes) -> RawMessage:
    return RawMessage(mid, 1, TOPIC, payload, None, time.time())


def valid(seq: int, source: str = "s") -> bytes:
    return json.dumps({"x": [0.5, 1.5], "y": [1.0], "source": source, "seq": seq}).encode()


json_trees = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**500), 10**500) | st.floats() | st.text(),
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=3), kids, max_size=5)
    ),
    max_leaves=30,
)
msgpack_trees = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text()
    | st.binary(max_size=64),
    lambda kids: st.lists(kids, max_size=5)
    | st.dictionaries(st.sampled_from(["x", "y", "w", "dtype", "shape", "data", "ts", "seq"]),
                      kids, max_size=6),
    max_leaves=30,
)  # fmt: skip
payloads = st.one_of(
    st.binary(max_size=300),
    json_trees.map(lambda tree: json.dumps(tree).encode()),
    st.fixed_dictionaries({"x": json_trees, "y": json_trees}, optional={"ts": json_trees})
    .map(lambda tree: json.dumps(tree).encode()),
    msgpack_trees.map(msgpack.packb),
    st.fixed_dictionaries({"x": msgpack_trees, "y": msgpack_trees}).map(msgpack.packb),
)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(payloads, min_size=1, max_size=8))
def test_every_message_ends_acknowledged_exactly_once(batch: list[bytes]) -> None:
    worker, connection, _, metrics = worker_for(None)
    for mid, payload in enumerate(batch, start=1):
        worker._take(message(mid, payload))
    worker.commit.flush()
    assert connection.acks == list(range(1, len(batch) + 1))
    rejected = len(connection.published)
    accepted = metrics.registry.get_sample_value(
        "livefit_ingest_messages_total", {"model": "m", "outcome": "accepted", "reason": "none"}
    )
    assert rejected + (accepted or 0) == len(batch)


def test_an_exception_nobody_foresaw_is_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    worker, connection, _, metrics = worker_for(None)

    def broken(*_: object) -> None:
        raise MemoryError("the decoder blew up")

    monkeypatch.setattr("livefit.server.ingest.worker.decode_message", broken)
    worker._take(message(7, valid(1)))
    worker.commit.flush()
    assert connection.acks == [7]
    report = json.loads(connection.published[0][1])
    assert report["reason"] == "internal" and "MemoryError" in report["detail"]
    assert (
        metrics.registry.get_sample_value(
            "livefit_ingest_messages_total",
            {"model": "m", "outcome": "rejected", "reason": "internal"},
        )
        == 1
    )


class FailingLog(WriteAheadLog):
    """A real log whose writes fail with ENOSPC while ``full`` is set."""

    full = True

    def _write(self, record: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._write(record)


def test_a_log_that_cannot_store_a_group_leaves_no_trace(tmp_path: Path) -> None:
    worker, connection, samples, metrics = worker_for(None)
    wal = FailingLog(tmp_path / "wal")
    wal.open()
    worker.commit.wal = wal
    worker.start()
    try:
        for seq in range(5):
            connection.inbox.put(message(seq + 1, valid(seq)))
        deadline = time.monotonic() + 5
        while not metrics.registry.get_sample_value(
            "livefit_storage_errors_total", {"op": "wal_write"}
        ):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)  # several retries
        assert connection.acks == [] and len(samples) == 0
        assert not worker.commit.storage.healthy
        assert "No space left" in worker.commit.storage.problems()[0]
        assert worker.route.sequences is not None
        assert worker.route.sequences.dumps() == SequenceTracker().dumps()  # nothing held yet
        wal.full = False  # room again: the same group goes through, once
        deadline = time.monotonic() + 10
        # acked once durable, then queued: stopping in between would leave the rest to replay
        while len(connection.acks) < 5 or len(samples) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        worker.stop()
        wal.close()
    assert connection.acks == [1, 2, 3, 4, 5] and len(samples) == 5
    assert worker.commit.storage.healthy
    logged = [r for r in WriteAheadLog(tmp_path / "wal").replay()]
    assert len(logged) == 5  # positions of failed attempts are skipped, never reused
    assert len({r.position for r in logged}) == 5


def test_stopping_while_the_log_fails_forgets_the_pending_numbers(tmp_path: Path) -> None:
    worker, connection, _, _ = worker_for(None)
    wal = FailingLog(tmp_path / "wal")
    wal.open()
    worker.commit.wal = wal
    worker._take(message(1, valid(0)))
    worker._stopping.set()
    worker.commit.flush()
    assert connection.acks == []
    assert worker.route.sequences is not None
    assert not worker.route.sequences.check("s", 0)  # the redelivered message is accepted


def test_a_queue_nobody_drains_reports_a_stall(tmp_path: Path) -> None:
    # 0.6 s: room for a test worker that waits for a core between the two checks' puts
    worker, connection, samples, _ = worker_for(tmp_path, capacity=1, stall_after_s=0.6)
    worker.start()
    try:
        for seq in range(3):  # the first fills the queue; the worker waits to queue the second
            connection.inbox.put(message(seq + 1, valid(seq)))
        time.sleep(0.1)
        for seq in range(3, 6):  # these arrive and wait: nothing is finished any more
            connection.inbox.put(message(seq + 1, valid(seq)))
        assert not worker.stalled()
        time.sleep(1.5)
        assert worker.stalled()
    finally:
        # A closed queue ends the wait for room at once: the stop does not wait STOP_DELIVERY_S
        # (8 s, which would be most of this test's time) to queue the message in hand.
        samples.close()
        worker.stop()
        assert worker.commit.wal is not None
        worker.commit.wal.close()


def test_without_dedup_gaps_are_counted_and_duplicates_kept() -> None:
    worker, _, samples, metrics = worker_for(None, dedup=False)
    for mid, seq in enumerate([0, 1, 1, 5], start=1):
        worker._take(message(mid, valid(seq)))
    worker.commit.flush()
    assert len(samples) == 4  # the repeat is trained too: dedup is off
    assert metrics.registry.get_sample_value("livefit_ingest_seq_missing", {"model": "m"}) == 3


def test_a_wall_clock_step_is_no_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 item 5: durations inside the learner use the monotonic clock. A message that
    has just arrived did not wait an hour because the wall clock was stepped +1 h."""
    worker, connection, _, _ = worker_for(tmp_path, stall_after_s=30.0)
    connection.inbox.put(message(1, valid(0)))  # waiting: the worker is not started
    stepped = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: stepped)
    assert not worker.stalled()
