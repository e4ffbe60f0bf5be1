"""Accepted samples: one message's samples (``SampleChunk``) and a training minibatch formed
from several (``Batch``). The types only; the bounded queue between ingestion and a trainer is
``ingest.sample_queue``.
"""

from __future__ import annotations

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
    joined: bool = False  # made by the label join (delayed labels), not a samples message

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def split(self, n: int) -> tuple[SampleChunk, SampleChunk]:
        """The first ``n`` samples and the rest, sharing memory with this chunk.

        Only the rest keeps the position: the message is complete when its last part is.
        """
        head = SampleChunk(
            self.x[:n], self.y[:n], self.w[:n], self.published_at, self.received_at,
            joined=self.joined,
        )  # fmt: skip
        tail = SampleChunk(
            self.x[n:], self.y[n:], self.w[n:], self.published_at, self.received_at, self.position,
            self.joined,
        )  # fmt: skip
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
    backlog: int = 0  # samples still queued when this batch was taken (0: it took them all)

    def __len__(self) -> int:
        return int(self.x.shape[0])
