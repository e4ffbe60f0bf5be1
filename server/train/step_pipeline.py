"""The next plain batch's step started before the previous batch is finished (``StepPipeline``,
``train.pipeline``; ``pipelining`` says where it runs).

The trainer's thread gets an asynchronous TensorFlow executor (``asynchronous_executor``), so a
dispatched step runs on TensorFlow's threads while the trainer's thread does the previous
batch's bookkeeping (its scores, drift test, replay, metrics) and the next batch's scaling.
Measured: the bookkeeping between two steps also costs the step 200-300 us to wake TensorFlow's
idle threads, which a step already queued avoids (BENCHMARKS.md, trainer). The next step is
started assuming the previous one applies and brings no drift reaction; where it does not, the
next step is rewound (``TrainStep.rewind``) with the policy (``UpdatePolicy.state_point``) and
started again once the previous batch is finished, so the model, its versions and its scores are
those of one batch after the other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..base.metrics import ErrorMetrics, Metrics
from ..config.machine import usable_cores
from ..config.model import ModelSettings
from ..wire.samples import Batch
from .hooks import TrainerHooks
from .metrics import TrainingMetrics
from .placement import Placement
from .update_policy import Learned, Started, UpdatePolicy

log = logging.getLogger(__name__)


def pipelining(settings: ModelSettings, placement: Placement, serving_here: bool) -> bool:
    """Whether the trainer pipelines its steps (``train.pipeline``): never with several devices
    or model selection. "auto": where this process may use 2 or more CPUs (on one, the
    bookkeeping and the step only take turns: measured 25-30 % slower) and serves no predictions
    (a one-process learner's event loop would get the GIL less often: the pipelined trainer does
    its Python work while TensorFlow computes)."""
    mode = settings.train.pipeline
    if mode == "off" or settings.selection.enabled or placement.replicas > 1:
        return False
    return mode == "on" or (usable_cores() >= 2 and not serving_here)


@contextmanager
def asynchronous_executor() -> Iterator[None]:
    """This thread's TensorFlow executor asynchronous while inside; on the way out, waits for
    what it runs (an error there is a step's, already counted) and makes it synchronous again."""
    from tensorflow.python.eager import context

    ctx = context.context()
    # This thread's executor only (the context keeps it alive; an executor object set
    # with ``ctx.executor`` and dropped leaves the thread synchronous).
    ctx.execution_mode = context.ASYNC
    try:
        yield
    finally:
        try:
            ctx.executor.wait()
        except Exception:  # an error of a step already counted: nothing more to do
            ctx.executor.clear_error()
        ctx.execution_mode = context.SYNC


@dataclass(slots=True)
class Pending:
    """A batch the pipelined trainer has started and not finished."""

    started: Started
    batch: Batch  # as it came from the queue
    started_at: float  # perf_counter when it was taken


class StepPipeline:
    """Starts and finishes the batches of model ``name`` with ``policy``, two apart where both
    are plain; ``account`` counts each batch finished (``Accounting.account``)."""

    def __init__(
        self,
        name: str,
        policy: UpdatePolicy,
        account: Callable[[Batch, Learned, float], None],
        hooks: TrainerHooks,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.policy = policy
        self.step = policy.step
        self.account = account
        self.hooks = hooks
        self.metrics = metrics
        self.rewinds = 0  # steps started early that had to run again

    def overlap(self, pending: Pending | None, batch: Batch) -> Pending | None:
        """Start ``batch`` and finish ``pending``: the start first where both are plain
        batches (the overlap), else one after the other. Returns what is left running."""
        started_at = time.perf_counter()
        extras_allowed = not self.hooks.predictions_waiting()
        policy = self.policy
        if (
            pending is None
            or pending.started.dispatched is None
            or not policy.plain(batch, extras_allowed)
        ):
            self.complete(pending)
            return self._start(batch, extras_allowed, started_at)
        point = policy.state_point()
        policy.assume_applied(pending.started)
        try:
            following = policy.start(batch, extras_allowed)
        except Exception:
            # Maybe the previous step's own error, which an asynchronous executor reports at
            # the next call: finish that batch first (its error is counted there), then start
            # this one again, which now fails only for its own reasons.
            policy.restore_point(point)
            pending.started.assumed = False
            _clear_async_error()
            self.complete(pending)
            return self._start(batch, extras_allowed, started_at)
        rewound = False

        def rewind() -> None:
            """The previous step did not apply or brought a drift reaction (or failed): undo
            ``following`` (its step and what starting it changed), to be started again."""
            nonlocal rewound
            rewound = True
            self.rewinds += 1
            self.metrics.group(TrainingMetrics).train_rewinds.labels(model=self.name).inc()
            try:
                applied = self.step.collect(following.dispatched).applied  # type: ignore[arg-type]
            except Exception:  # not run: the executor failed on the step before it
                _clear_async_error()
                applied = False
            if applied:
                self.step.rewind()
            policy.restore_point(point)

        if not self.complete(pending, rewind) and not rewound:
            rewind()  # the previous batch failed: ``following`` assumed it had applied
        if rewound:
            return self._start(batch, extras_allowed, started_at)
        return Pending(following, batch, started_at)

    def complete(self, pending: Pending | None, surprise: Callable[[], None] | None = None) -> bool:
        """Finish ``pending`` (waits for its step) and account for it; False where that
        raised (counted and logged)."""
        if pending is None:
            return True
        try:
            learned = self.policy.finish(pending.started, surprise)
            self.account(pending.batch, learned, time.perf_counter() - pending.started_at)
        except Exception:
            self.failed(pending.batch)
            return False
        return True

    def failed(self, batch: Batch) -> None:
        """Count and log a batch whose learning raised (as the trainer's plain loop does), and
        clear an asynchronous executor's error state, which would fail every later step."""
        self.metrics.group(ErrorMetrics).internal_errors.labels(component="trainer").inc()
        log.exception("training step failed for %s (batch of %d)", self.name, len(batch))
        _clear_async_error()

    def _start(self, batch: Batch, extras_allowed: bool, started_at: float) -> Pending | None:
        """Start ``batch``; a batch with extra steps is finished here too."""
        try:
            started = self.policy.start(batch, extras_allowed)
        except Exception:
            self.failed(batch)
            return None
        pending = Pending(started, batch, started_at)
        if started.dispatched is not None:
            return pending
        self.complete(pending)
        return None


def _clear_async_error() -> None:
    """Clear this thread's TensorFlow executor's error state (an asynchronous executor fails
    every later call until then)."""
    from tensorflow.python.eager import context

    context.context().executor.clear_error()
