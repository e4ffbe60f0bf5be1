"""The bounded queue between ingestion and a model's trainer.

The queue counts capacity in samples, not messages, so a 100-sample message weighs 100. A full
queue blocks the producer (the ingest worker), which stops acknowledging MQTT messages, which
makes the broker hold the rest: backpressure without dropping anything.

Queued samples live in blocks of preallocated rows, not as one array per message: ``put`` copies a
small message into the newest block (one slice assignment), and ``next_batch`` takes one slice
per block it spans, so forming a batch of 1,024 single-sample messages costs a few numpy calls
instead of 1,024 Python steps and a 1,024-way ``np.concatenate`` (profiled: 22 % of the trainer
thread). A message at least a block's size is queued as its own block, uncopied.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import numpy as np

from ..wire.samples import Batch, SampleChunk


class QueueClosed(Exception):
    """The queue was closed: no more samples will come."""


BLOCK_ROWS = 8192  # rows a block holds at most: several batches, so few batches span two
BLOCK_BYTES = 4 << 20  # ... and at most this many bytes of x (big samples, fewer rows)


class _Block:
    """Samples in one set of arrays: rows ``[start, end)`` are queued; rows are written once.

    Per row it also keeps the message's publish time (NaN: none), a message counter (to count
    the messages a batch holds), whether the label join made it, and, on a message's last row
    only, its write-ahead-log position (-1 elsewhere). Rows are never rewritten, so a batch
    may be a view of a block.
    """

    __slots__ = ("end", "joined", "message", "position", "published", "start", "w", "x", "y")

    def __init__(self, x: np.ndarray, y: np.ndarray, w: np.ndarray, end: int) -> None:
        rows = x.shape[0]
        self.x, self.y, self.w = x, y, w
        self.published = np.full(rows, np.nan)
        self.message = np.zeros(rows, dtype=np.int64)
        self.joined = np.zeros(rows, dtype=bool)
        self.position = np.full(rows, -1, dtype=np.int64)
        self.start, self.end = 0, end

    @classmethod
    def for_rows_like(cls, chunk: SampleChunk) -> _Block:
        """An empty block for samples shaped like ``chunk``'s."""
        row_bytes = max(1, math.prod(chunk.x.shape[1:]) * chunk.x.itemsize)
        rows = max(1, min(BLOCK_ROWS, BLOCK_BYTES // row_bytes))
        return cls(
            np.empty((rows, *chunk.x.shape[1:]), chunk.x.dtype),
            np.empty((rows, *chunk.y.shape[1:]), chunk.y.dtype),
            np.empty(rows, chunk.w.dtype),
            end=0,
        )

    @classmethod
    def holding(cls, chunk: SampleChunk, message: int) -> _Block:
        """A block that is ``chunk`` itself (its arrays, not a copy)."""
        block = cls(chunk.x, chunk.y, chunk.w, end=len(chunk))
        block._describe(0, len(chunk), chunk, message)
        return block

    def fits(self, chunk: SampleChunk) -> bool:
        """True if ``chunk`` can be appended: room left, same sample shapes and dtypes."""
        return (
            self.x.shape[0] - self.end >= len(chunk)
            and self.x.shape[1:] == chunk.x.shape[1:]
            and self.y.shape[1:] == chunk.y.shape[1:]
            and self.x.dtype == chunk.x.dtype
            and self.y.dtype == chunk.y.dtype
            and self.w.dtype == chunk.w.dtype
        )

    def append(self, chunk: SampleChunk, message: int) -> None:
        a, b = self.end, self.end + len(chunk)
        self.x[a:b], self.y[a:b], self.w[a:b] = chunk.x, chunk.y, chunk.w
        self._describe(a, b, chunk, message)
        self.end = b

    def _describe(self, a: int, b: int, chunk: SampleChunk, message: int) -> None:
        if chunk.published_at is not None:
            self.published[a:b] = chunk.published_at
        self.message[a:b] = message
        self.joined[a:b] = chunk.joined
        if chunk.position is not None and b > a:
            self.position[b - 1] = chunk.position

    @property
    def queued(self) -> int:
        return self.end - self.start


class SampleQueue:
    """Bounded FIFO of samples that forms dynamic minibatches.

    ``put`` blocks while the queue holds ``capacity`` samples or more. ``next_batch`` blocks for
    the first sample, then takes whatever is already queued up to ``max_batch_size`` samples,
    lingering up to ``max_wait_s`` for more when the batch is not full (``joined_wait_s`` where
    every sample taken was made by the label join: labels trickle in one at a time). A message
    larger than the room left in a batch is split; its remainder stays at the head of the
    queue, and the batch that takes its last sample carries its write-ahead-log position.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._blocks: deque[_Block] = deque()
        self._size = 0
        self._messages = 0  # messages ever queued: numbers each one
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
        n = len(chunk)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._not_full:
            while not self._closed and self._size > 0 and self._size + n > self.capacity:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._not_full.wait(remaining)
            if self._closed:
                raise QueueClosed
            if n == 0:
                return True
            self._messages += 1
            tail = self._blocks[-1] if self._blocks else None
            if tail is not None and tail.queued == 0 and not tail.fits(chunk):
                self._blocks.pop()  # drained: batches may still view it, nothing else will
                tail = None
            if tail is not None and tail.fits(chunk):
                tail.append(chunk, self._messages)
            else:
                block = _Block.for_rows_like(chunk)
                if block.x.shape[0] > n:
                    block.append(chunk, self._messages)
                else:  # a block's worth or more: queue the message's own arrays
                    block = _Block.holding(chunk, self._messages)
                self._blocks.append(block)
            self._size += n
            self._not_empty.notify()
            return True

    def next_batch(
        self,
        max_batch_size: int,
        max_wait_s: float = 0.0,
        timeout: float | None = None,
        joined_wait_s: float = 0.0,
    ) -> Batch | None:
        """The next minibatch, or None if ``timeout`` passed with nothing queued.

        Raises QueueClosed once the queue is closed and empty.
        """
        with self._not_empty:
            if not self._wait_for_first(timeout):
                return None
            parts = self._take(max_batch_size)
            if joined_wait_s > max_wait_s and all(b.joined[i:j].all() for b, i, j in parts):
                max_wait_s = joined_wait_s
            if max_wait_s > 0:
                linger_until = time.monotonic() + max_wait_s
                count = sum(b - a for _, a, b in parts)
                while count < max_batch_size and not self._closed:
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0:
                        break
                    if not self._size:
                        self._not_empty.wait(remaining)
                        continue
                    more = self._take(max_batch_size - count)
                    parts.extend(more)
                    count += sum(b - a for _, a, b in more)
            self._not_full.notify_all()
            return _batch(parts, backlog=self._size)

    def close(self) -> None:
        """Refuse new chunks and wake every waiter; queued chunks can still be taken."""
        with self._lock:
            self._closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def _wait_for_first(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._size:
            if self._closed:
                raise QueueClosed
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._not_empty.wait(remaining)
        return True

    def _take(self, room: int) -> list[tuple[_Block, int, int]]:
        """Take at most ``room`` samples from the head: (block, first row, end row) parts."""
        parts: list[tuple[_Block, int, int]] = []
        while self._blocks and room > 0:
            block = self._blocks[0]
            n = min(room, block.queued)
            if n:
                parts.append((block, block.start, block.start + n))
                block.start += n
                room -= n
                self._size -= n
            # A drained block goes, unless it is the newest and still has room to fill.
            if block.queued == 0 and (len(self._blocks) > 1 or block.end == block.x.shape[0]):
                self._blocks.popleft()
            elif n == 0:
                break
        return parts


def _batch(parts: list[tuple[_Block, int, int]], backlog: int = 0) -> Batch:
    """One batch from block slices: views when it is one slice, else one concatenation."""
    if len(parts) == 1:
        block, a, b = parts[0]
        x, y, w = block.x[a:b], block.y[a:b], block.w[a:b]
    else:
        x = np.concatenate([block.x[a:b] for block, a, b in parts])
        y = np.concatenate([block.y[a:b] for block, a, b in parts])
        w = np.concatenate([block.w[a:b] for block, a, b in parts])
    oldest = newest = None
    position = -1
    messages = 0
    for block, a, b in parts:
        published = block.published[a:b]
        published = published[~np.isnan(published)]
        if published.size:
            low, high = float(published.min()), float(published.max())
            oldest = low if oldest is None else min(oldest, low)
            newest = high if newest is None else max(newest, high)
        position = max(position, int(block.position[a:b].max()))
        messages += int(block.message[b - 1] - block.message[a]) + 1
    return Batch(
        x=x,
        y=y,
        w=w,
        chunks=messages,
        oldest_published_at=oldest,
        newest_published_at=newest,
        position=position if position >= 0 else None,
        backlog=backlog,
    )
