"""Where one model's messages go (``Route``): what the runtime hands its ingest worker."""

from __future__ import annotations

from dataclasses import dataclass

from ..labels.joiner import LabelJoiner
from ..wire.codec import SampleSpec
from .dedup import SequenceTracker
from .sample_queue import SampleQueue


@dataclass(frozen=True, slots=True)
class Route:
    """Where one model's samples go: its subscription, shapes, queue and dead-letter topic.

    ``sequences`` follows (source, seq) numbers: it drops duplicates when ``drop_duplicates``
    (the model's ``dedup`` setting) and otherwise only counts what is missing."""

    model: str
    subscription: str
    spec: SampleSpec
    queue: SampleQueue
    dead_letter_topic: str
    sequences: SequenceTracker | None = None
    drop_duplicates: bool = False
    labels: LabelJoiner | None = None  # its delayed labels (labels and predictions topics)
