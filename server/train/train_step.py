"""The compiled training step: score the batch (prequential), then one gradient update.

Why not ``model.train_on_batch``: in Keras 3 on TensorFlow it traces twice before it relaxes the
batch dimension and costs 0.3-0.5 ms more per call (measured here: 1.31 ms vs 0.80 ms for a
64x64 MLP at batch 256). This step has one ``tf.function`` with a ``None`` batch dimension in its
input signature, so it is traced exactly once whatever batch sizes arrive. It follows Keras'
own semantics: loss = sum(per-sample loss * weight) / batch size, plus the layers' own losses.

With a ``target_scaling`` layer (online target standardization) the step fits the network's
standardized output to the standardized target, ``(y - mean) / std``, with the statistics the
layer gets after this step (those including the batch): the statistics the model will map its
output back with. Scoring used the statistics from before the batch (the forward pass is the
prequential prediction). Training on the old ones instead would fit the first batch to raw
targets (the statistics start as the identity), whose gradients, thousands of times larger
than later ones, would hold Adam-like optimizers' second moments up for hundreds of steps.
The losses and predictions the step reports are in the user's units (the model's output
against ``y``), so prequential scores and the training loss metric read as the target.

With weight averaging (``train.weight_average`` = d > 0) the step also keeps an exponential
moving average of the trained weights, updated in the graph after each applied update with
decay min(d, t / (``AVERAGE_START`` + t)) at the t-th update (the average follows a fresh
model's first steps instead of dragging its initial weights along), and scores the batch with
the averaged weights too (``model.stateless_call``, one more forward pass; in
``StepResult.average_losses`` and ``average_predictions``). The update policy decides which
of the two are served (``serve_average``: snapshots carry ``served_weights``) and reports the
served ones' scores, so the prequential score is that of the model clients get. The trained
weights keep learning as before; a rolled-back step leaves the average as it was.

The averaged weights score only the rows whose scores are read (``scored_rows``: a batch's own
samples, not the replayed ones after them, and none on a batch's later steps), and, where they
are not the weights served (``serve_average`` False when the step is started), at most
``COMPARISON_ROWS`` evenly spaced rows of those (``StepResult.average_rows``): their scores
then only feed the windowed comparison that chooses the served weights, which a sample of a
large batch informs as well as the whole of it, and which takes those rows whichever weights
are served (``comparison_stride``). The served weights' scores always cover every
row (the trained weights' come free with the training forward pass). Measured: the averaged
weights' forward pass was a fifth of the trainer's time at batch 1,024 (BENCHMARKS.md, trainer).

The learning rate is an input of the step too (``TrainStep.learning_rate``, which the update
policy sets for its start and drift boosts), assigned to the optimizer's variable in the graph
before the update (after the rollback copy, so a rolled-back step leaves the previous rate
too): an eager assignment costs 130-350 us (Keras' setter, measured), half a
step's time at batch 256, and a fresh model's start boost changes the rate every step. So the
optimizer's variable holds the rate of the last step run, ``learning_rate`` that of the next.

The rate, the averaged weights' rows and the statistics enter as one float32 vector, and the
step's outputs are three (the loss with whether it applied; the per-sample losses and the
predictions, each concatenated over the weights scored): every input converted and every
output read back costs the trainer's thread a few microseconds, and the thread's CPU per step
is what the pipelined trainer has to hide behind TensorFlow's. Measured: dispatch and
read-back of a step 289-358 -> 217-252 us at batch 256, 313-375 -> 275-295 us at 1,024
(thread CPU time, this and the 0-d rate together).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from livefit.models.experts import linear_expert_model

from ..base.flat_call import flat_caller
from .placement import Placement, as_placement, pad_rows
from .step_graph import ExpertsRule, StepGraph, StepVariables

log = logging.getLogger(__name__)

# Rows of a batch the averaged weights score where they are not the served ones (see above)
COMPARISON_ROWS = 256


def comparison_stride(rows: int) -> int:
    """The stride of the rows of a batch of ``rows`` on which the trained and the averaged
    weights are compared: every row up to ``COMPARISON_ROWS``, else at most that many, evenly
    spaced (``range(0, rows, stride)``). The same rows whichever weights are served, so that
    the comparison does not depend on it (the pipelined trainer starts a batch before the
    choice of the batch before it is known)."""
    return -(-rows // COMPARISON_ROWS) if rows > COMPARISON_ROWS else 1


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step reports: the training loss, and the pre-update scores of every sample."""

    loss: float  # in the user's units (also with target scaling)
    prequential_losses: np.ndarray  # (n,) per-sample loss before the update
    predictions: np.ndarray  # (n, *output_shape) before the update
    applied: bool = True  # False: a loss, prediction, gradient or new weight was not finite
    # With weight averaging: the same scores from the averaged weights (else None), of the
    # rows ``average_rows`` (indices into the arrays above; None: every row)
    average_losses: np.ndarray | None = None
    average_predictions: np.ndarray | None = None
    average_rows: np.ndarray | None = None
    # With experts: each one's share of the mixture and recent error per sample, after the step
    expert_shares: np.ndarray | None = None
    expert_errors: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A step started by ``TrainStep.dispatch``: its output tensors (maybe not computed yet)
    and its inputs, kept alive until ``collect``."""

    rows: int
    outputs: tuple[tf.Tensor, ...]
    inputs: tuple[np.ndarray, ...]
    scored: int = 0  # rows the trained weights' scores cover (with the padding for replicas)
    average_rows: np.ndarray | None = None  # the rows the averaged weights scored (None: all)


class TrainStep:
    """Callable ``step(x, y, w) -> StepResult`` for one compiled Keras model, on one device or
    mirrored on several (``Placement``; the model built and compiled in its scope)."""

    def __init__(
        self,
        model: keras.Model,
        loss_fn,
        input_shape: list[int],
        target_shape: list[int],
        device: str | Placement,
        weight_average: float = 0.0,
        rewindable: bool = False,
        experts: ExpertsRule | None = None,
    ) -> None:
        self.model = model
        self.weight_average = weight_average
        self._input_shape = tuple(input_shape)
        self._target_shape = tuple(target_shape)
        # Whether snapshots carry the averaged weights (the update policy decides, see
        # weight_choice.WeightChoice); False without averaging.
        self.serve_average = False
        placement = as_placement(device)
        self.placement = placement
        self.device = placement.primary
        # The rate the next step runs at: an input of the step, assigned in the graph (see the
        # module's docstring). None where the optimizer's rate is not a variable (a schedule).
        rate = getattr(model.optimizer, "_learning_rate", None)
        rate_variable = rate if isinstance(rate, keras.Variable) else None
        self._rate_variable = rate_variable
        self._rate: float | None = None
        # float32 like the optimizer's variable, the first value of the controls vector; a 0-d
        # array, not a numpy scalar, so that reshaping it costs no conversion
        self._rate_input = np.array(0.0, dtype=np.float32)
        if rate_variable is not None:
            self.learning_rate = float(np.asarray(rate_variable))
        # With experts the model's optimizer trains the network; the linear expert learns by
        # plain SGD in the step (``ExpertsGraph``)
        linear = linear_expert_model(model) if experts is not None else None
        linear_ids = set() if linear is None else {id(v) for v in linear.trainable_variables}
        optimized = [v for v in model.trainable_variables if id(v) not in linear_ids]
        self.optimized = optimized
        variables = StepVariables.create(model, placement, weight_average, rewindable, optimized)
        self._variables = variables
        self._averages = variables.averages
        self._averaged = variables.averaged
        self.rewindable = rewindable
        graph = StepGraph(
            model, loss_fn, variables, placement, rate_variable, weight_average, experts
        )
        self.experts = None if graph.experts is None else graph.experts.mixture.experts
        self._graph = graph
        # With a Standardize layer, new statistics travel into the step and are assigned in the
        # graph after the update (two eager assigns per step cost more than the step itself);
        # likewise the target statistics of a target_scaling layer.
        self._scaler = graph.scaler
        self._target = graph.target
        self._layout = graph.layout
        self._step = graph.step_function(input_shape, target_shape)
        self._call = self._step
        # called through their traces once warmed up, as the step is (``warm_up``)
        self._functions = (
            graph.keep_function(),
            graph.rewind_function(),
            graph.restart_average_function(),
        )
        self._keep: Callable[[], tf.Tensor]
        self._rewind: Callable[[], tf.Tensor]
        self._restart_average: Callable[[], tf.Tensor]
        self._keep, self._rewind, self._restart_average = self._functions
        self._flat: Callable[[list[object]], list[tf.Tensor]] | None = None

    def warm_up(self) -> None:
        """Trace the step now (without running it), so the first real batch is not slow; run
        the rewind and the average's restart once, changing nothing (see below). Call it before
        the first step: its run of the rewind overwrites the rewind's copies, so a step
        applied before it could no longer be rewound.

        Later calls go straight to the traced graph: ``tf.function.__call__`` binds and
        canonicalises the inputs against the signature and looks the trace up on every call,
        which cost 0.2-0.5 ms a step (about 20 % of the trainer thread, profiled).
        """
        with tf.device(self.device):
            self._call = self._step.get_concrete_function()
            self._run_unapplied()
            # The others too are called through their traces: tf.function's own call counts the
            # traces of one code across a learner's models and warned of "retracing" from the 5th
            keep, rewind, restart_average = self._functions
            if self.rewindable:
                self._keep = keep.get_concrete_function()
                self._rewind = rewind.get_concrete_function()
                # Run now, not only traced: a graph's first run builds its kernels, and that
                # cost a rewind 30 ms (a tenth of a 200,000-sample benchmark run at batch
                # 1,024, which the first false drift's rewind paid). A rewind right after
                # ``keep`` restores what was just copied, so the pair changes nothing.
                self._keep()
                self._rewind()
            if self._averages:  # likewise the drift reaction's restart of the average (14 ms
                # of eager assigns at the first drift, measured), then the average put back
                self._restart_average = restart_average.get_concrete_function()
                kept = self.average_state()
                self._restart_average()
                self.restore_average(kept)
        self._flat = flat_caller(self._call)

    def _run_unapplied(self) -> None:
        """Run the step once, on one row of zeros at a NaN learning rate, so that its kernels
        are built before the first real batch: a graph's first run builds them, which cost the
        first batch of a fresh model 0.29 s (TrumpApproval's network, 4 steps; 7 ms after
        this run; docs/design.md, "Training step"). The NaN rate makes every updated value
        non-finite, so the step rolls itself back as it does any non-finite update: the
        weights, the optimizer's state and rate, the model's other variables and the average
        are as before (``tests/unit/train/test_train_step_paths.py``). Only where the rate is an
        input of the step (not a schedule) and on one device; elsewhere the first batch builds
        them."""
        if self._rate_variable is None or self.placement.replicas > 1 or self._rate is None:
            return
        rate = self._rate
        x = np.zeros((1, *self._input_shape), dtype=np.float32)
        y = np.zeros((1, *self._target_shape), dtype=np.float32)
        weights, optimizer_state = self.model.get_weights(), self.optimizer_state()
        average = self.average_state()  # a restored checkpoint's, where warm-up follows one
        try:
            self.learning_rate = math.nan
            result = self.collect(self.dispatch(x, y, np.ones(1, dtype=np.float32)))
        finally:
            self.learning_rate = rate
        if result.applied:  # not with Keras' optimizers, which all scale by the rate: put back
            log.warning("the warm-up step at a NaN learning rate applied (an optimizer that "
                        "ignores its rate?); the weights before it are restored")  # fmt: skip
            self.restore(weights, optimizer_state)  # restarts the average: the saved one back
            self.restore_average(average)

    @property
    def traces(self) -> int:
        """How many times the step was traced: stays 1 whatever batch sizes arrive."""
        return int(self._step.experimental_get_tracing_count())

    def __call__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        w: np.ndarray,
        statistics: tuple[np.ndarray, np.ndarray] | None = None,
        target_statistics: tuple[np.ndarray, np.ndarray] | None = None,
        scored_rows: int | None = None,
        fresh_rows: int | None = None,
    ) -> StepResult:
        """One step; with a Standardize layer, ``statistics`` (mean, std) are set if it applies,
        with a target_scaling layer ``target_statistics`` likewise (default: keep the current
        ones). On several devices the batch is padded with zero-weight rows to a multiple of
        their count; the result holds the real rows only. ``scored_rows``: how many leading
        rows' scores the caller reads (default all), which is all the averaged weights score
        (see the module's docstring). ``fresh_rows``: with experts, how many leading rows are
        new samples, seen for the first time (default all): the linear expert learns them and
        the mixture weighs the experts by their errors on them."""
        return self.collect(
            self.dispatch(x, y, w, statistics, target_statistics, scored_rows, fresh_rows)
        )

    def dispatch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        w: np.ndarray,
        statistics: tuple[np.ndarray, np.ndarray] | None = None,
        target_statistics: tuple[np.ndarray, np.ndarray] | None = None,
        scored_rows: int | None = None,
        fresh_rows: int | None = None,
    ) -> Dispatched:
        """Start the step (arguments as ``__call__``'s); ``collect`` its result. In a thread
        whose TensorFlow executor is asynchronous (the pipelined trainer's,
        ``step_pipeline.asynchronous_executor``) this returns before the step has run, so the
        caller can do other work meanwhile; the arrays must then stay unchanged until
        ``collect`` (the trainer's batches are never written again)."""
        rows = len(x)
        replicas = self.placement.replicas
        args: list[object] = [x, y, w]
        padded_rows = rows  # the rows the step scores, with the padding for the replicas
        if replicas > 1:
            padded = pad_rows(x, y, w, replicas)
            padded_rows = len(padded[0])
            args = [*padded, np.array(rows, dtype=np.float32)]
        average_rows = None
        if self._layout.used:
            controls = [self._rate_input.reshape(1)] if self._rate_variable is not None else []
            if self._layout.samples_average:
                scored, stride, average_rows = self._average_sample(rows, scored_rows)
                controls.append(np.array([scored, stride], dtype=np.float32))
            if self._layout.fresh_rows:
                fresh = rows if fresh_rows is None else max(0, min(int(fresh_rows), rows))
                controls.append(np.array([fresh], dtype=np.float32))
            for layer, given in ((self._scaler, statistics), (self._target, target_statistics)):
                if layer is not None:  # default: the statistics the layer holds now
                    pair = given if given is not None else (layer.mean, layer.std)
                    controls += [np.ravel(np.asarray(value, dtype=np.float32)) for value in pair]
            args.append(np.concatenate(controls))
        with tf.device(self.device):
            outputs = self._flat(args) if self._flat is not None else self._call(*args)
        return Dispatched(rows, tuple(outputs), (x, y, w), padded_rows, average_rows)

    def _average_sample(
        self, rows: int, scored_rows: int | None
    ) -> tuple[int, int, np.ndarray | None]:
        """The rows the averaged weights score in a step of ``rows``: (scored, stride, their
        indices, None where that is every row). All ``scored_rows`` where they are served,
        else at most ``COMPARISON_ROWS`` of them, evenly spaced."""
        scored = rows if scored_rows is None else max(0, min(int(scored_rows), rows))
        stride = 1 if self.serve_average else comparison_stride(scored)
        if stride == 1 and scored == rows:
            return scored, stride, None
        return scored, stride, np.arange(0, scored, stride)

    def collect(self, dispatched: Dispatched) -> StepResult:
        """The result of a dispatched step (waits for it to finish)."""
        rows = dispatched.rows
        scalars, losses, pred = (output.numpy() for output in dispatched.outputs)
        loss, applied = float(scalars[0]), bool(scalars[1])
        shares = errors = None
        if self.experts is not None:  # each expert's share, then its recent error
            count = len(self.experts)
            shares, errors = scalars[2 : 2 + count], scalars[2 + count : 2 + 2 * count]
        if not self._averages:
            return StepResult(
                loss, losses[:rows], pred[:rows], applied, expert_shares=shares,
                expert_errors=errors,
            )  # fmt: skip
        # the averaged weights' scores follow the trained ones' (``dispatched.scored`` rows)
        scored = dispatched.scored
        trained, trained_pred = losses[:rows], pred[:rows]
        if dispatched.average_rows is None:
            average, average_pred = losses[scored : scored + rows], pred[scored : scored + rows]
        else:
            average, average_pred = losses[scored:], pred[scored:]
        return StepResult(
            loss, trained, trained_pred, applied, average, average_pred, dispatched.average_rows,
            shares, errors,
        )  # fmt: skip

    def rewind(self) -> None:
        """Undo the last step, which was applied (``StepResult.applied``): the weights, the
        optimizer's state and rate, the averaged weights and the model's other variables
        (scaling and batch normalisation statistics, dropout's seed state) go back to what they
        were before it, exactly (copies taken by the step). Needs ``rewindable``.
        The trainer's pipeline uses it when a step it started early, assuming the step before
        would apply, turns out to have followed a rolled-back step or a drift reaction."""
        if not self.rewindable:
            raise RuntimeError("this step keeps no copies to rewind to (rewindable=False)")
        with tf.device(self.device):
            self._rewind()

    @property
    def learning_rate(self) -> float | None:
        """The learning rate the next step runs at (assigned to the optimizer's variable in
        the step's graph); None where the optimizer's rate is not a variable (a schedule)."""
        return self._rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._rate = float(value)
        # float32 like the variable; a rate beyond float32 becomes its largest value, not inf
        self._rate_input = np.array(
            min(float(value), float(np.finfo(np.float32).max)), dtype=np.float32
        )

    @property
    def averaging(self) -> bool:
        """Whether predictions use averaged weights (``train.weight_average`` > 0)."""
        return bool(self._averages)

    def served_weights(self) -> list[np.ndarray]:
        """Copies of the weights predictions use, in ``model.get_weights()`` order: the
        averaged ones in place of the trained ones when averaging, else the model's own."""
        if not self._averages or not self.serve_average:
            return [np.asarray(w) for w in self.model.get_weights()]
        average_of = {
            id(v): a for v, a in zip(self.model.trainable_variables, self._averages, strict=True)
        }
        return [np.array(average_of.get(id(v), v).numpy()) for v in self.model.weights]

    def reset_average(self) -> None:
        """Restart the average from the current weights (after a drift: the old concept's
        weights would otherwise linger in what is served)."""
        if not self._averages:
            return
        with tf.device(self.device):  # one graph (run once by warm_up), not an eager op each
            self._restart_average()

    def average_state(self) -> dict[str, np.ndarray]:
        """The averaged weights and their step count, for a checkpoint's extra arrays."""
        if not self._averages:
            return {}
        state = {f"average_{i}": np.array(a.numpy()) for i, a in enumerate(self._averages)}
        state["average_steps"] = np.array(self._averaged.numpy())
        return state

    def restore_average(self, extra: dict[str, np.ndarray]) -> None:
        """Take the averaged weights from a checkpoint's extra arrays; without them (averaging
        was off when it was written) the average restarts from the current weights."""
        if not self._averages:
            return
        if "average_steps" not in extra or any(
            f"average_{i}" not in extra for i in range(len(self._averages))
        ):
            self.reset_average()
            return
        for i, mean in enumerate(self._averages):
            mean.assign(np.reshape(extra[f"average_{i}"], mean.shape))
        self._averaged.assign(float(np.asarray(extra["average_steps"]).reshape(())))

    def _with_fresh_experts(self, weights: list[np.ndarray]) -> list[np.ndarray]:
        """``weights`` as they are where they fit the model; a network's weights without the
        experts' (a checkpoint from before them) completed with the experts' current values."""
        model_weights = self.model.weights
        if len(weights) == len(model_weights) or self._graph.experts is None:
            return weights
        experts = self._graph.experts
        own = {id(v) for v in (*experts.linear.weights, *experts.mixture.weights)}
        kept = [v for v in model_weights if id(v) not in own]
        if len(weights) != len(kept):
            return weights  # set_weights names the mismatch
        given = iter(weights)
        log.info("restoring a checkpoint written without experts: the network's weights, the "
                 "linear expert and the mixture afresh")  # fmt: skip
        return [v.numpy() if id(v) in own else next(given) for v in model_weights]

    def optimizer_state(self) -> list[np.ndarray]:
        """Copies of the optimizer's variables (for checkpoints)."""
        return [np.array(v.numpy()) for v in self.model.optimizer.variables]

    def restore(self, weights: list[np.ndarray], optimizer_state: list[np.ndarray]) -> None:
        """Set weights and optimizer variables from a checkpoint of the same model, or of the
        same network written before it had experts (a learner upgraded to them: the linear
        expert and the mixture then start afresh beside the restored network)."""
        variables = self.model.optimizer.variables
        if len(variables) != len(optimizer_state):
            raise ValueError(
                f"checkpoint has {len(optimizer_state)} optimizer variables, model has "
                f"{len(variables)}: was the optimizer or architecture changed?"
            )
        self.model.set_weights(self._with_fresh_experts(weights))
        for variable, value in zip(variables, optimizer_state, strict=True):
            variable.assign(np.reshape(value, variable.shape))  # safetensors stores () as (1,)
        self.reset_average()  # restore_average takes the checkpoint's average, where it has one
