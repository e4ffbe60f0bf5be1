"""Accepted samples and the bounded queue between ingestion and a model's trainer.

The queue counts capacity in samples, not messages, so a 100-sample message weighs 100. A full
queue blocks the producer (the ingest worker), which stops acknowledging MQTT messages, which
makes the broker hold the rest: backpressure without dropping anything.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SampleChunk:
    """One message's samples: ``x`` (n, *input_shape), ``y`` (n, *target_shape), ``w`` (n,)."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    published_at: float | None = None  # the message's "ts" (epoch seconds), when it had one
    received_at: float = 0.0  # time.time() when the ingest worker accepted it
    position: int | None = None  # write-ahead-log position of its message, when logged

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def split(self, n: int) -> tuple[SampleChunk, SampleChunk]:
        """The first ``n`` samples and the rest, sharing memory with this chunk.

        Only the rest keeps the position: the message is complete when its last part is.
        """
        head = SampleChunk(self.x[:n], self.y[:n], self.w[:n], self.published_at, self.received_at)
        tail = SampleChunk(
            self.x[n:], self.y[n:], self.w[n:], self.published_at, self.received_at, self.position
        )
        return head, tail


@dataclass(frozen=True, slots=True)
class Batch:
    """A training minibatch formed from one or more chunks."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    chunks: int  # how many chunks (messages or parts of messages) it holds
    oldest_published_at: float | None  # earliest "ts" among them, for freshness
    newest_published_at: float | None
    position: int | None = None  # WAL position of the last message completed by this batch

    def __len__(self) -> int:
        return int(self.x.shape[0])


class QueueClosed(Exception):
    """The queue was closed: no more samples will come."""


class SampleQueue:
    """Bounded FIFO of sample chunks that forms dynamic minibatches.

    ``put`` blocks while the queue holds ``capacity`` samples or more. ``next_batch`` blocks for
    the first sample, then takes whatever is already queued up to ``max_batch_size`` samples,
    lingering up to ``max_wait_s`` for more when the batch is not full. A chunk larger than the
    room left in a batch is split; its remainder stays at the head of the queue.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._chunks: deque[SampleChunk] = deque()
        self._size = 0
        self._closed = False
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)

    def __len__(self) -> int:
        """Samples queued now."""
        return self._size

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, chunk: SampleChunk, timeout: float | None = None) -> bool:
        """Queue ``chunk``; wait while the queue is full. False if ``timeout`` passed first.

        A chunk larger than the whole capacity is admitted once the queue is empty, so a big
        message can never wedge the stream.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._not_full:
            while not self._closed and self._size > 0 and self._size + len(chunk) > self.capacity:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._not_full.wait(remaining)
            if self._closed:
                raise QueueClosed
            self._chunks.append(chunk)
            self._size += len(chunk)
            self._not_empty.notify()
            return True

    def next_batch(
        self, max_batch_size: int, max_wait_s: float = 0.0, timeout: float | None = None
    ) -> Batch | None:
        """The next minibatch, or None if ``timeout`` passed with nothing queued.

        Raises QueueClosed once the queue is closed and empty.
        """
        with self._not_empty:
            if not self._wait_for_first(timeout):
                return None
            taken = self._take(max_batch_size)
            if max_wait_s > 0:
                linger_until = time.monotonic() + max_wait_s
                count = sum(len(c) for c in taken)
                while count < max_batch_size and not self._closed:
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0:
                        break
                    if not self._chunks:
                        self._not_empty.wait(remaining)
                        continue
                    more = self._take(max_batch_size - count)
                    taken.extend(more)
                    count += sum(len(c) for c in more)
            self._not_full.notify_all()
        return _concatenate(taken)

    def close(self) -> None:
        """Refuse new chunks and wake every waiter; queued chunks can still be taken."""
        with self._lock:
            self._closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def _wait_for_first(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._chunks:
            if self._closed:
                raise QueueClosed
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._not_empty.wait(remaining)
        return True

    def _take(self, room: int) -> list[SampleChunk]:
        """Pop chunks totalling at most ``room`` samples (splitting the last one if needed)."""
        taken: list[SampleChunk] = []
        while self._chunks and room > 0:
            chunk = self._chunks[0]
            if len(chunk) <= room:
                self._chunks.popleft()
            else:
                chunk, rest = chunk.split(room)
                self._chunks[0] = rest
            taken.append(chunk)
            room -= len(chunk)
            self._size -= len(chunk)
        return taken


def _concatenate(chunks: list[SampleChunk]) -> Batch:
    published = [c.published_at for c in chunks if c.published_at is not None]
    positions = [c.position for c in chunks if c.position is not None]
    if len(chunks) == 1:
        only = chunks[0]
        x, y, w = only.x, only.y, only.w
    else:
        x = np.concatenate([c.x for c in chunks])
        y = np.concatenate([c.y for c in chunks])
        w = np.concatenate([c.w for c in chunks])
    return Batch(
        x=x,
        y=y,
        w=w,
        chunks=len(chunks),
        oldest_published_at=min(published) if published else None,
        newest_published_at=max(published) if published else None,
        position=max(positions) if positions else None,
    )
