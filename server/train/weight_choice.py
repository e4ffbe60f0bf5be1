"""Which weights are served with weight averaging: the trained ones or their average.

The step scores a batch with both (``TrainStep``); this keeps each one's prequential loss over
the last ``AVERAGE_WINDOW`` compared samples and serves the averaged weights while theirs is
the lower (``TrainStep.serve_average``, which snapshots read). Every caught-up batch is
compared; of the batches taken from a backlog one in ``BACKLOG_COMPARISON_EVERY``: like the
extra steps and the replay, most of the comparison is work a trainer behind its stream skips
(docs/design.md, "Weight averaging"; BENCHMARKS.md, trainer). The windowed losses travel in
checkpoints, so a restarted learner serves what it served.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from ..wire.samples import Batch
from .prequential import WindowedMean
from .train_step import StepResult, TrainStep, comparison_stride

log = logging.getLogger(__name__)
AVERAGE_WINDOW = 500  # samples: the windowed losses that choose trained or averaged weights
# Of the batches taken from a backlog, one in this many compares the trained and the averaged
# weights (``WeightChoice.compares``); every caught-up batch does.
BACKLOG_COMPARISON_EVERY = 8
_KEYS = ("average_choice_trained", "average_choice_averaged", "average_steps")


class WeightChoice:
    """The choice between one step's trained and averaged weights (``step.serve_average``)."""

    def __init__(self, step: TrainStep) -> None:
        self.step = step
        self.trained_loss = WindowedMean(AVERAGE_WINDOW)
        self.average_loss = WindowedMean(AVERAGE_WINDOW)
        self.uncompared = 0  # batches started since the last one compared
        # Whether the last plain batch started scored the averaged weights on rows that depend
        # on which weights were served when it started, so that a switch of the served weights
        # before it finishes needs it started again (``started``).
        self.started_served_dependent = False

    def compares(self, batch: Batch) -> bool:
        """Whether ``batch``'s scores feed the comparison: every caught-up batch's
        (``Batch.backlog`` 0), and one in ``BACKLOG_COMPARISON_EVERY`` of those taken from a
        backlog. The other batches of a backlog are scored with the averaged weights only
        where they are the served ones, and cost no second forward pass where they are not;
        the choice goes on following the stream, from fewer batches."""
        return batch.backlog == 0 or self.uncompared + 1 >= BACKLOG_COMPARISON_EVERY

    def start(self, batch: Batch) -> tuple[bool, int]:
        """Whether ``batch`` is compared, and the rows whose scores by the averaged weights
        are read: the batch's own samples where they are served or compared, else none."""
        compare = self.compares(batch)
        self.uncompared = 0 if compare else self.uncompared + 1
        return compare, len(batch) if compare or self.step.serve_average else 0

    def started(self, batch: Batch, compare: bool) -> None:
        """A plain batch was dispatched: a switch of the served weights before it finishes
        changes what it should have scored where it scored the averaged weights on none or a
        sample of its rows (they become served) or, compared, on every row of a large batch
        while they were served (one batch after the other rounds that sample apart)."""
        self.started_served_dependent = (
            comparison_stride(len(batch)) > 1 if compare else not self.step.serve_average
        )

    def choose(self, first: StepResult, compare: bool = True) -> StepResult:
        """The scores of the weights served before this batch (the averaged ones where their
        windowed prequential loss was the lower), then, where the batch is ``compare``d, with
        this batch's losses of both added (of the rows both scored: the averaged weights,
        when not served, score a sample of a large batch), which weights to serve from now
        on."""
        if first.average_losses is None or first.average_predictions is None:
            return first
        served = first
        rows = first.average_rows
        if self.step.serve_average:
            if rows is not None:  # TrainStep scores every row of the served weights
                raise RuntimeError("the served averaged weights scored a sample of the batch")
            served = replace(
                first,
                prequential_losses=first.average_losses,
                predictions=first.average_predictions,
            )
        if first.applied and compare:
            # The same rows whichever weights were served (``comparison_stride``): those the
            # averaged weights score when they are not.
            compared = slice(None, None, comparison_stride(len(first.prequential_losses)))
            averaged = first.average_losses if rows is not None else first.average_losses[compared]
            self.trained_loss.add(first.prequential_losses[compared])
            self.average_loss.add(averaged)
            self.step.serve_average = self.average_did_better()
        return served

    def average_did_better(self) -> bool:
        """Whether the averaged weights' windowed prequential loss is the lower (False while
        neither has one)."""
        return bool(self.average_loss.value < self.trained_loss.value)

    def state(self) -> dict[str, np.ndarray]:
        """The windowed losses, as a checkpoint's extra arrays (with averaging)."""
        if not self.step.averaging:
            return {}
        return {
            "average_choice_trained": self.trained_loss.batches(),
            "average_choice_averaged": self.average_loss.batches(),
        }

    def restore(self, extra: dict[str, np.ndarray]) -> None:
        """Serve what was served at the checkpoint: its windowed losses of both weights, and
        the choice they make. A checkpoint without them (or without an average) leaves the
        trained weights served until the average does better."""
        if not self.step.averaging or any(key not in extra for key in _KEYS):
            return
        try:
            trained = WindowedMean.from_batches(AVERAGE_WINDOW, extra[_KEYS[0]])
            averaged = WindowedMean.from_batches(AVERAGE_WINDOW, extra[_KEYS[1]])
        except ValueError as error:  # a checkpoint that passed its checksum but not this
            log.warning(
                "checkpoint's choice between averaged and trained weights is unreadable (%s): "
                "serving the trained weights until the average does better",
                error,
            )
            return
        self.trained_loss, self.average_loss = trained, averaged
        self.step.serve_average = self.average_did_better()
