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

from livefit.models.standardize import standardize_layer
from livefit.models.target_scaling import standardized_view, target_scaling_layer

from ..base.flat_call import flat_caller
from .placement import Placement, as_placement, pad_rows, replica_slice

log = logging.getLogger(__name__)

AVERAGE_START = 9.0  # the average's decay is t / (AVERAGE_START + t) while that is smaller
# Rows of a batch the averaged weights score where they are not the served ones (see above)
COMPARISON_ROWS = 256
_TRAINING_SENSITIVE = (
    keras.layers.Dropout,
    keras.layers.BatchNormalization,
    keras.layers.GaussianNoise,
    keras.layers.GaussianDropout,
    keras.layers.AlphaDropout,
    keras.layers.SpatialDropout1D,
    keras.layers.SpatialDropout2D,
    keras.layers.SpatialDropout3D,
)


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


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A step started by ``TrainStep.dispatch``: its output tensors (maybe not computed yet)
    and its inputs, kept alive until ``collect``."""

    rows: int
    outputs: tuple[tf.Tensor, ...]
    inputs: tuple[np.ndarray, ...]
    scored: int = 0  # rows the trained weights' scores cover (with the padding for replicas)
    average_rows: np.ndarray | None = None  # the rows the averaged weights scored (None: all)


def behaves_same_in_training(model: keras.Model) -> bool:
    """True when ``model(x, training=True)`` equals ``model(x, training=False)``.

    Then the training forward pass doubles as the prequential prediction and the step costs
    one forward pass, not two.
    """
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, _TRAINING_SENSITIVE):
            return False
        if getattr(layer, "dropout", 0) or getattr(layer, "recurrent_dropout", 0):
            return False
    return True


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
    ) -> None:
        self.model = model
        self.weight_average = weight_average
        self._input_shape = tuple(input_shape)
        self._target_shape = tuple(target_shape)
        # Whether snapshots carry the averaged weights (the update policy decides, see
        # UpdatePolicy._choose_weights); False without averaging.
        self.serve_average = False
        placement = as_placement(device)
        self.placement = placement
        self.device = placement.primary
        # With a Standardize layer, new statistics travel into the step and are assigned in the
        # graph after the update (two eager assigns per step cost more than the step itself).
        scaler = standardize_layer(model)
        self._scaler = scaler
        # Likewise the target statistics of a target_scaling layer; the view returns the
        # standardized output (what the loss fits) beside the prediction in the user's units.
        target = target_scaling_layer(model)
        self._target = target
        view = standardized_view(model)
        optimizer = model.optimizer
        # The rate the next step runs at: an input of the step, assigned in the graph (see the
        # module's docstring). None where the optimizer's rate is not a variable (a schedule).
        rate = getattr(optimizer, "_learning_rate", None)
        rate_variable = rate if isinstance(rate, keras.Variable) else None
        self._rate_variable = rate_variable
        self._rate: float | None = None
        # float32 like the optimizer's variable, the first value of the controls vector; a 0-d
        # array, not a numpy scalar, so that reshaping it costs no conversion
        self._rate_input = np.array(0.0, dtype=np.float32)
        if rate_variable is not None:
            self.learning_rate = float(np.asarray(rate_variable))
        # Everything a step changes, and a device-side copy to roll a bad step back to.
        with placement.scope():
            optimizer.build(model.trainable_variables)
            state = [*model.trainable_variables, *optimizer.variables]
            backup = [
                tf.Variable(v, trainable=False, name=f"backup_{i}") for i, v in enumerate(state)
            ]
            # The averaged weights (train.weight_average) and how many updates they average.
            averages = (
                [
                    tf.Variable(v, trainable=False, name=f"average_{i}")
                    for i, v in enumerate(model.trainable_variables)
                ]
                if weight_average > 0
                else []
            )
            averaged = tf.Variable(0.0, trainable=False, name="averaged_steps")
            # The model's other variables (scaling statistics, batch normalisation's moving
            # statistics, dropout's seed state), which the forward pass itself may move: copied
            # at the start of every step, put back when the step is not applied (so a rolled-
            # back batch leaves none of them moved, NaN statistics included) and by ``rewind``.
            trained = {id(v) for v in model.trainable_variables}
            others = [v for v in model.variables if id(v) not in trained]
            others_backup = [
                tf.Variable(v, trainable=False, name=f"others_{i}") for i, v in enumerate(others)
            ]
            # With ``rewindable``: the averaged weights and their count, copied before an
            # update too, so that ``rewind`` can undo the last applied step whole.
            beyond = [*averages, averaged] if rewindable else []
            beyond_backup = [
                tf.Variable(v, trainable=False, name=f"rewind_{i}") for i, v in enumerate(beyond)
            ]
        self._backup = backup
        # (copy, variable): what a rewind puts back (the averages only where rewindable)
        copies = [*zip(backup, state, strict=True), *zip(beyond_backup, beyond, strict=True)]
        self._averages = averages
        self._averaged = averaged
        self.rewindable = rewindable
        separate_eval = not behaves_same_in_training(model)
        replicas = placement.replicas
        signature = [
            tf.TensorSpec([None, *input_shape], tf.float32, name="x"),
            tf.TensorSpec([None, *target_shape], tf.float32, name="y"),
            tf.TensorSpec([None], tf.float32, name="w"),
        ]
        if replicas > 1:  # the real rows of a batch padded to a multiple of the replicas
            signature.append(tf.TensorSpec([], tf.float32, name="rows"))
        # The learning rate and the statistics travel as one float32 vector, "controls": one
        # input to convert and pass instead of up to five (each costs the trainer's thread
        # 7-10 us a step). Its layout: the rate (where the step takes one), then each scaling
        # layer's mean and std, flattened.
        stats_shapes = [
            tuple(layer.stats_shape) for layer in (scaler, target) if layer is not None
            for _ in ("mean", "std")
        ]  # fmt: skip
        control_sizes = [1] if rate_variable is not None else []
        # With averaging on one device: the rows the averaged weights score, 0 to ``scored``
        # in steps of ``stride`` (see the module's docstring), two values.
        self._samples_average = bool(averages) and replicas == 1
        control_sizes += [2] if self._samples_average else []
        control_sizes += [int(np.prod(shape, dtype=np.int64)) for shape in stats_shapes]
        self._takes_controls = bool(control_sizes)
        if control_sizes:
            signature.append(tf.TensorSpec([sum(control_sizes)], tf.float32, name="controls"))

        def per_sample(y: tf.Tensor, pred: tf.Tensor) -> tf.Tensor:
            values = loss_fn(y, pred)
            rank = len(values.shape)
            return values if rank == 1 else tf.reduce_mean(values, axis=list(range(1, rank)))

        def layer_losses() -> tf.Tensor:
            # Each replica adds its share: the summed gradients then count them once.
            total = tf.add_n(model.losses)
            return total if replicas == 1 else total / replicas

        def forward(
            x: tf.Tensor,
            y: tf.Tensor,
            w: tf.Tensor,
            rows: tf.Tensor,
            *stats: tf.Tensor,
            sampled: tf.Tensor | None = None,
        ):
            """The loss over ``rows`` samples (of which these are some), its gradients, the
            per-sample scores and the predictions (training forward pass and scored); with
            averaging, the averaged weights' scores of the rows ``sampled`` (scored rows,
            stride) picks (default: every row)."""
            scored = model(x, training=False) if separate_eval else None
            with tf.GradientTape() as tape:
                if view is not None and target is not None:
                    standardized, pred = view(x, training=True)
                    target_mean, target_std = stats[-2:]  # the statistics after this step
                    fitted = per_sample((y - target_mean) / target_std, standardized)
                else:
                    pred = model(x, training=True)
                    fitted = per_sample(y, pred)
                loss = tf.reduce_sum(fitted * w) / rows
                if model.losses:
                    loss += layer_losses()
            grads = tape.gradient(loss, model.trainable_variables)
            if view is not None:  # reported in the user's units
                losses = per_sample(y, pred)
                reported = tf.reduce_sum(losses * w) / rows
                if model.losses:
                    reported += layer_losses()
            else:
                losses, reported = fitted, loss
            if scored is not None:
                losses = per_sample(y, scored)
            out = scored if scored is not None else pred
            extras: tuple[tf.Tensor, ...] = ()
            if averages:  # the averaged weights' scores too (pre-update, like the others)

                def averaged_scores(xa: tf.Tensor, ya: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                    averaged_out, _ = model.stateless_call(
                        [a.value() for a in averages],
                        [v.value for v in model.non_trainable_variables],
                        xa,
                        training=False,
                    )
                    return per_sample(ya, averaged_out), averaged_out

                if sampled is None:
                    extras = averaged_scores(x, y)
                else:
                    rows_scored = tf.cast(sampled[0], tf.int32)
                    index = tf.range(0, rows_scored, tf.cast(sampled[1], tf.int32))
                    # No rows (a batch's later steps): no forward pass on an empty batch,
                    # which some kernels (cuDNN's recurrent ones) have refused.
                    extras = tf.cond(
                        rows_scored > 0,
                        lambda: averaged_scores(tf.gather(x, index), tf.gather(y, index)),
                        lambda: (tf.zeros_like(losses[:0]), tf.zeros_like(out[:0])),
                    )
            return loss, reported, losses, pred, out, grads, extras

        def update(loss, reported, pred, grads, stats, rate, mirrored=None) -> tf.Tensor:
            """Apply ``grads`` (their ``mirrored`` copies, one per device, where given) at
            learning rate ``rate`` (None: the optimizer's own) if everything is finite; True
            when applied."""
            # The reported loss and the predictions too: with target scaling the fitted loss
            # can be finite while the prediction in the user's units is not.
            finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(reported))
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(pred)))
            for grad in grads:
                finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))
            applied_grads = grads if mirrored is None else mirrored
            applied = tf.cond(
                finite, lambda: apply(applied_grads, rate), lambda: tf.constant(False)
            )
            if stats:  # after the forward pass: this batch used the old statistics
                tf.cond(applied, lambda: set_statistics(*stats), lambda: tf.constant(False))
            tf.cond(applied, lambda: tf.constant(True), restore_others)
            return applied

        def save_others() -> None:
            for saved, variable in zip(others_backup, others, strict=True):
                saved.assign(variable)

        def restore_others() -> tf.Tensor:
            for saved, variable in zip(others_backup, others, strict=True):
                variable.assign(saved)
            return tf.constant(False)

        if placement.strategy is None:

            @tf.function(input_signature=signature)
            def step(x: tf.Tensor, y: tf.Tensor, w: tf.Tensor, *inputs: tf.Tensor):
                rate, sampled, stats = unpack(inputs)
                save_others()
                rows = tf.cast(tf.shape(x)[0], tf.float32)
                loss, reported, losses, pred, out, grads, extras = forward(
                    x, y, w, rows, *stats, sampled=sampled
                )
                applied = update(loss, reported, pred, grads, stats, rate)
                return packed(reported, applied, losses, out, extras)

        else:
            strategy = placement.strategy

            def on_replica(x, y, w, rows, *stats):
                part = [replica_slice(t, replicas) for t in (x, y, w)]
                return forward(*part, rows, *stats)

            def gathered(values) -> tf.Tensor:
                return tf.concat(strategy.experimental_local_results(values), axis=0)

            @tf.function(input_signature=signature)
            def step(x, y, w, rows, *inputs):
                rate, _, stats = unpack(inputs)
                save_others()
                # The replicas' forward and backward passes, then the update once, across
                # replicas: rollback and statistics as on one device, every copy alike.
                results = strategy.run(on_replica, args=(x, y, w, rows, *stats))
                loss, reported, losses, pred, out, grads, extras = results
                loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
                reported = strategy.reduce(tf.distribute.ReduceOp.SUM, reported, axis=None)
                real = tf.cast(rows, tf.int32)
                pred = gathered(pred)[:real]
                pairs = [
                    (g, v.value) for g, v in zip(grads, model.trainable_variables, strict=True)
                ]
                # Summed onto each variable's devices (all-reduce), not through one device.
                grads = strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs)
                checked = [strategy.experimental_local_results(g)[0] for g in grads]
                applied = update(loss, reported, pred, checked, stats, rate, grads)
                return packed(
                    reported, applied, gathered(losses), gathered(out),
                    tuple(gathered(e) for e in extras),
                )  # fmt: skip

        def unpack(inputs: tuple[tf.Tensor, ...]):
            """The learning rate (None where the step takes none), the averaged weights' rows
            (None: every row) and the statistics, each in its layer's shape, from the controls
            vector (see ``control_sizes``)."""
            if not control_sizes:
                return None, None, ()
            parts = tf.split(inputs[0], control_sizes)
            rate = parts.pop(0)[0] if rate_variable is not None else None
            sampled = parts.pop(0) if self._samples_average else None
            stats = tuple(
                tf.reshape(part, shape) for part, shape in zip(parts, stats_shapes, strict=True)
            )
            return rate, sampled, stats

        def packed(reported, applied, losses, out, extras):
            """Three outputs instead of up to six (each one the trainer's thread reads back
            costs it a tensor and a copy): the loss and whether the step applied, as a
            float32 pair; the per-sample losses of the trained weights followed by the averaged
            ones' where averaging (which may score fewer rows); their predictions likewise."""
            scalars = tf.stack([tf.cast(reported, tf.float32), tf.cast(applied, tf.float32)])
            if not extras:
                return scalars, losses, out
            average_losses, average_out = extras
            return scalars, tf.concat([losses, average_losses], 0), tf.concat([out, average_out], 0)

        def set_statistics(*stats: tf.Tensor) -> tf.Tensor:
            layers = [layer for layer in (scaler, target) if layer is not None]
            pairs = [stats[i : i + 2] for i in range(0, len(stats), 2)]
            for layer, (mean, std) in zip(layers, pairs, strict=True):
                layer.mean.assign(mean)
                layer.std.assign(std)
            return tf.constant(True)

        def apply(grads: list[tf.Tensor], rate: tf.Tensor | None) -> tf.Tensor:
            """Apply the update at ``rate``; if any new value is not finite, restore the state
            before it (the previous rate included)."""
            take_copies()
            if rate is not None and rate_variable is not None:
                rate_variable.assign(rate)
            optimizer.apply(grads, model.trainable_variables)
            ok = tf.constant(True)
            for variable in model.trainable_variables:
                ok = tf.logical_and(ok, tf.reduce_all(tf.math.is_finite(variable)))

            def restore() -> tf.Tensor:
                for saved, variable in zip(backup, state, strict=True):
                    variable.assign(saved)
                return tf.constant(False)

            if not averages:
                return tf.cond(ok, lambda: tf.constant(True), restore)
            return tf.cond(ok, average, restore)

        def average() -> tf.Tensor:
            """Move the averaged weights towards the new ones: an exponential moving average
            with decay ``weight_average``, debiased at the start (decay t / (AVERAGE_START + t)
            at the t-th update while that is smaller), so the average follows a fresh model's
            first steps."""
            t = averaged.assign_add(1.0)
            decay = tf.minimum(weight_average, t / (AVERAGE_START + t))
            for mean, variable in zip(averages, model.trainable_variables, strict=True):
                mean.assign(decay * mean + (1.0 - decay) * variable)
            return tf.constant(True)

        @tf.function(input_signature=[])
        def rewind() -> tf.Tensor:
            for saved, variable in copies:
                variable.assign(saved)
            restore_others()
            return tf.constant(True)

        def take_copies() -> None:
            """What ``rewind`` puts back, copied: the state (weights, optimizer variables) and,
            where rewindable, the averaged weights and their count."""
            for saved, variable in copies:
                saved.assign(variable)

        @tf.function(input_signature=[])
        def keep() -> tf.Tensor:
            """Copy everything ``rewind`` restores into its copies: a rewind right after is
            then the identity (``warm_up`` runs the pair once)."""
            take_copies()
            save_others()
            return tf.constant(True)

        @tf.function(input_signature=[])
        def restart_average() -> tf.Tensor:
            for mean, variable in zip(averages, model.trainable_variables, strict=True):
                mean.assign(variable)
            averaged.assign(0.0)
            return tf.constant(True)

        self._step = step
        self._call = step
        self._rewind = rewind
        self._keep = keep
        self._restart_average = restart_average
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
            if self.rewindable:
                # Run now, not only traced: a graph's first run builds its kernels, and that
                # cost a rewind 30 ms (a tenth of a 200,000-sample benchmark run at batch
                # 1,024, which the first false drift's rewind paid). A rewind right after
                # ``keep`` restores what was just copied, so the pair changes nothing.
                self._keep()
                self._rewind()
            if self._averages:  # likewise the drift reaction's restart of the average (14 ms
                # of eager assigns at the first drift, measured), then the average put back
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
        are as before (``tests/unit/test_train_step_paths.py``). Only where the rate is an input of
        the step (not a schedule) and on one device; elsewhere the first batch builds them."""
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
    ) -> StepResult:
        """One step; with a Standardize layer, ``statistics`` (mean, std) are set if it applies,
        with a target_scaling layer ``target_statistics`` likewise (default: keep the current
        ones). On several devices the batch is padded with zero-weight rows to a multiple of
        their count; the result holds the real rows only. ``scored_rows``: how many leading
        rows' scores the caller reads (default all), which is all the averaged weights score
        (see the module's docstring)."""
        return self.collect(self.dispatch(x, y, w, statistics, target_statistics, scored_rows))

    def dispatch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        w: np.ndarray,
        statistics: tuple[np.ndarray, np.ndarray] | None = None,
        target_statistics: tuple[np.ndarray, np.ndarray] | None = None,
        scored_rows: int | None = None,
    ) -> Dispatched:
        """Start the step (arguments as ``__call__``'s); ``collect`` its result. In a thread
        whose TensorFlow executor is asynchronous (the pipelined trainer's,
        ``Trainer._run_pipelined``) this returns before the step has run, so the caller can do
        other work meanwhile; the arrays must then stay unchanged until ``collect`` (the
        trainer's batches are never written again)."""
        rows = len(x)
        replicas = self.placement.replicas
        args: list[object] = [x, y, w]
        padded_rows = rows  # the rows the step scores, with the padding for the replicas
        if replicas > 1:
            padded = pad_rows(x, y, w, replicas)
            padded_rows = len(padded[0])
            args = [*padded, np.array(rows, dtype=np.float32)]
        average_rows = None
        if self._takes_controls:
            controls = [self._rate_input.reshape(1)] if self._rate_variable is not None else []
            if self._samples_average:
                scored, stride, average_rows = self._average_sample(rows, scored_rows)
                controls.append(np.array([scored, stride], dtype=np.float32))
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
        if not self._averages:
            return StepResult(loss, losses[:rows], pred[:rows], applied)
        # the averaged weights' scores follow the trained ones' (``dispatched.scored`` rows)
        scored = dispatched.scored
        trained, trained_pred = losses[:rows], pred[:rows]
        if dispatched.average_rows is None:
            average, average_pred = losses[scored : scored + rows], pred[scored : scored + rows]
        else:
            average, average_pred = losses[scored:], pred[scored:]
        return StepResult(
            loss, trained, trained_pred, applied, average, average_pred, dispatched.average_rows
        )

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

    def optimizer_state(self) -> list[np.ndarray]:
        """Copies of the optimizer's variables (for checkpoints)."""
        return [np.array(v.numpy()) for v in self.model.optimizer.variables]

    def restore(self, weights: list[np.ndarray], optimizer_state: list[np.ndarray]) -> None:
        """Set weights and optimizer variables from a checkpoint of the same model."""
        variables = self.model.optimizer.variables
        if len(variables) != len(optimizer_state):
            raise ValueError(
                f"checkpoint has {len(optimizer_state)} optimizer variables, model has "
                f"{len(variables)}: was the optimizer or architecture changed?"
            )
        self.model.set_weights(weights)
        for variable, value in zip(variables, optimizer_state, strict=True):
            variable.assign(np.reshape(value, variable.shape))  # safetensors stores () as (1,)
        self.reset_average()  # restore_average takes the checkpoint's average, where it has one
