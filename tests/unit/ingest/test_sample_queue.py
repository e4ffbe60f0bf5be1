"""The sample queue and its batch former, deterministic: no sleeps decide an outcome."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from livefit.server.ingest.sample_queue import BLOCK_ROWS, QueueClosed, SampleQueue
from livefit.server.wire.samples import SampleChunk


def chunk(n: int, start: int = 0, ts: float | None = None) -> SampleChunk:
    x = np.arange(start, start + n, dtype=np.float32).reshape(n, 1)
    return SampleChunk(x=x, y=x.copy(), w=np.ones(n, np.float32), published_at=ts)


def test_full_queue_gives_one_batch_of_max_size() -> None:
    queue = SampleQueue(capacity=10_000)
    for i in range(100):
        queue.put(chunk(10, start=i * 10))
    batch = queue.next_batch(max_batch_size=256)
    assert batch is not None and len(batch) == 256
    np.testing.assert_array_equal(batch.x[:, 0], np.arange(256))  # FIFO, split chunk included
    assert len(queue) == 1000 - 256
    rest = queue.next_batch(max_batch_size=256)
    assert rest is not None and rest.x[0, 0] == 256  # the split chunk's remainder comes first


def test_trickle_gives_small_batches() -> None:
    queue = SampleQueue(capacity=100)
    sizes = []
    for i in range(5):
        queue.put(chunk(1, start=i))
        batch = queue.next_batch(max_batch_size=256)
        assert batch is not None
        sizes.append(len(batch))
    assert sizes == [1, 1, 1, 1, 1]


def test_linger_collects_samples_arriving_within_max_wait() -> None:
    queue = SampleQueue(capacity=100)
    queue.put(chunk(1))

    def later() -> None:
        time.sleep(0.05)
        queue.put(chunk(2, start=1))

    thread = threading.Thread(target=later)
    thread.start()
    batch = queue.next_batch(max_batch_size=3, max_wait_s=5.0)
    thread.join()
    assert batch is not None and len(batch) == 3  # returned as soon as it was full


def joined(n: int, start: int = 0) -> SampleChunk:
    return replace(chunk(n, start), joined=True)


def test_joined_labels_linger_for_their_window_and_samples_do_not() -> None:
    """Samples the label join made wait ``joined_wait_s`` for more of them (labels fall due
    one by one); a batch holding a samples message's rows does not."""
    queue = SampleQueue(capacity=100)
    queue.put(joined(1))
    arrived = threading.Event()

    def later() -> None:
        time.sleep(0.05)
        queue.put(joined(2, start=1))
        arrived.set()

    thread = threading.Thread(target=later)
    thread.start()
    batch = queue.next_batch(max_batch_size=3, joined_wait_s=5.0)
    thread.join()
    assert arrived.is_set() and batch is not None and len(batch) == 3  # full: no more wait
    queue.put(chunk(1, start=3))
    queue.put(joined(1, start=4))
    mixed = queue.next_batch(max_batch_size=8, joined_wait_s=5.0)
    assert mixed is not None and len(mixed) == 2  # a message's sample among them: no linger
    # a split of a joined chunk stays joined
    queue.put(joined(4, start=5))
    head = queue.next_batch(max_batch_size=2, joined_wait_s=5.0)
    rest = queue.next_batch(max_batch_size=2, joined_wait_s=0.0)
    assert head is not None and rest is not None and len(head) == len(rest) == 2
    assert SampleChunk(*(np.zeros((1, 1)),) * 2, np.ones(1), joined=True).split(0)[1].joined


def test_next_batch_times_out_when_empty() -> None:
    assert SampleQueue(capacity=10).next_batch(8, timeout=0.01) is None


def test_put_blocks_while_full_and_resumes() -> None:
    queue = SampleQueue(capacity=10)
    queue.put(chunk(10))
    assert queue.put(chunk(1), timeout=0.05) is False  # full: the producer waits
    assert queue.next_batch(4) is not None
    assert queue.put(chunk(1), timeout=0.05) is True


def test_oversized_chunk_is_admitted_when_empty() -> None:
    queue = SampleQueue(capacity=10)
    assert queue.put(chunk(50), timeout=0.05) is True
    assert len(queue) == 50


def test_close_drains_then_raises() -> None:
    queue = SampleQueue(capacity=10)
    queue.put(chunk(3))
    queue.close()
    with pytest.raises(QueueClosed):
        queue.put(chunk(1))
    batch = queue.next_batch(8)
    assert batch is not None and len(batch) == 3
    with pytest.raises(QueueClosed):
        queue.next_batch(8)


def test_batch_tracks_publish_times() -> None:
    queue = SampleQueue(capacity=100)
    queue.put(chunk(2, ts=10.0))
    queue.put(chunk(2, ts=5.0))
    queue.put(chunk(2))
    batch = queue.next_batch(8)
    assert batch is not None
    assert (batch.oldest_published_at, batch.newest_published_at, batch.chunks) == (5.0, 10.0, 3)


def test_random_puts_and_takes_keep_order_positions_and_counts() -> None:
    """Against a plain model of the queue: every sample once, in order; each message's
    write-ahead-log position on the batch that takes its last sample; publish times per batch."""
    rng = np.random.default_rng(5)
    queue = SampleQueue(capacity=1_000_000)
    sent: list[np.ndarray] = []
    ends: dict[int, int] = {}  # position -> index of the message's last sample
    published: list[float] = []
    total = 0
    taken: list[np.ndarray] = []
    for step in range(600):
        if rng.random() < 0.6:
            n = int(
                rng.choice([0, 1, 1, 2, 7, 100, BLOCK_ROWS - 1, BLOCK_ROWS, 3 * BLOCK_ROWS // 2])
            )
            ts = float(step) if rng.random() < 0.7 else None
            piece = chunk(n, start=total, ts=ts)
            queue.put(SampleChunk(piece.x, piece.y, piece.w, ts, position=step))
            sent.append(piece.x[:, 0])
            if n:
                ends[step] = total + n - 1
            published += [np.nan if ts is None else ts] * n
            total += n
        elif len(queue):
            before = sum(len(t) for t in taken)
            batch = queue.next_batch(int(rng.integers(1, 2 * BLOCK_ROWS)))
            assert batch is not None
            taken.append(batch.x[:, 0].copy())
            after = before + len(batch)
            np.testing.assert_array_equal(batch.y, batch.x)
            finished = [p for p, last in ends.items() if before <= last < after]
            assert batch.position == (max(finished) if finished else None)
            window = np.array(published[before:after])
            window = window[~np.isnan(window)]
            expected = (float(window.min()), float(window.max())) if window.size else (None, None)
            assert (batch.oldest_published_at, batch.newest_published_at) == expected
    while len(queue):
        batch = queue.next_batch(4 * BLOCK_ROWS)
        assert batch is not None
        taken.append(batch.x[:, 0].copy())
    np.testing.assert_array_equal(np.concatenate(taken), np.arange(total, dtype=np.float32))


def test_single_sample_messages_form_one_batch_across_blocks() -> None:
    queue = SampleQueue(capacity=10 * BLOCK_ROWS)
    n = BLOCK_ROWS + 100  # spans two blocks
    for i in range(n + 10):
        queue.put(chunk(1, start=i, ts=float(i)))
    batch = queue.next_batch(n)
    assert batch is not None and len(batch) == n and batch.chunks == n
    np.testing.assert_array_equal(batch.x[:, 0], np.arange(n))
    assert (batch.oldest_published_at, batch.newest_published_at) == (0.0, float(n - 1))


def test_a_big_message_is_queued_without_a_copy() -> None:
    queue = SampleQueue(capacity=10 * BLOCK_ROWS)
    big = chunk(BLOCK_ROWS + 5)
    queue.put(big)
    batch = queue.next_batch(BLOCK_ROWS + 5)
    assert batch is not None and np.shares_memory(batch.x, big.x)
