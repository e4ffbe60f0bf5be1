"""What a trainer asks of the process around it (``TrainerHooks``), with neutral defaults.

Owns the interface only: the learner's runtime (``processes``) implements it; a trainer on its own
(a test, the bench) uses the defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..wire.samples import Batch
    from .selection import Switch


class TrainerHooks:
    """What a trainer asks of the process around it. Each answer has a neutral default, so a
    trainer on its own (a test, the bench) needs none; the learner's runtime overrides them."""

    # Whether this process also serves predictions (a one-process learner): its event loop
    # then shares the GIL with the trainer thread, and ``train.pipeline = "auto"`` stays off.
    serving_here = False

    def predictions_waiting(self) -> bool:
        """True while prediction requests wait for this model: the trainer gives way
        (``train.yield_to_serving_ms``) and skips its extra steps."""
        return False

    def log_frontier(self, trained_position: int) -> int:
        """The write-ahead-log position nobody needs any more, given what is trained."""
        return 0

    def checkpoint_notes(self) -> dict[str, bytes]:
        """Other state to save with each checkpoint (dedup, delayed labels), by name."""
        return {}

    def drift_detected(self, detections: int) -> None:
        """Concept drift was detected (``detections`` so far)."""

    def selection_switched(self, switch: Switch, version: int) -> None:
        """Online model selection serves another candidate from ``version`` on."""

    def batch_learned(self, batch: Batch, scored_by: int) -> None:
        """``batch`` was learned; ``scored_by`` is the version that predicted it before (the
        guard's shadow side compares that version with the last good one on these samples).
        Called on the trainer's thread: it must return at once."""
