"""The compiled training step's graph, built from named parts: the variables it changes and the
copies it restores, the layout of its one control vector, and the functions one step is made of
(score and fit the batch, check and apply the update, average the weights, roll back).

``TrainStep`` (``train_step.py``) owns a ``StepGraph`` and drives it from the trainer's thread:
what each part does and why is in that module's docstring; here is how the graph is put
together. Every function below runs inside ``tf.function`` traces, never eagerly, and is
traced as written, without autograph (as Keras' own train step is): a branch on a tensor is a
``tf.cond`` here, and autograph's rewriting of these functions cost 1.4 s of every learner's
start (docs/design.md, "Training step").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from livefit.models.experts import Mixture, experts_view, linear_expert_model, mixture_layer
from livefit.models.standardize import Standardize, standardize_layer
from livefit.models.target_scaling import (
    Unstandardize,
    standardized_view,
    target_scaling_layer,
)

from .placement import Placement, replica_slice

AVERAGE_START = 9.0  # the average's decay is t / (AVERAGE_START + t) while that is smaller
# A classifier expert's error is its wrong predictions plus this share of its loss: where both
# are right, the better-calibrated one wins (bench/results/experts.md, "The mixture's error")
LOSS_SHARE = 0.1
# One sample's error counts at most this much (a decisive e**-100 at rate 1): an expert's error
# that overflows to infinity would otherwise stay infinite, decay as it may
ERROR_CAP = 100.0

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


@dataclass(frozen=True, slots=True)
class ControlLayout:
    """The step's one float32 input vector, "controls": the learning rate (where the step
    takes one), the averaged weights' rows (two values: how many rows are scored and the
    stride, where averaging on one device), the batch's new rows (with experts: how many
    leading rows are first seen, which the linear expert learns and the mixture scores), then
    each scaling layer's mean and std, flattened.
    One input to convert and pass instead of up to five (each costs the trainer's thread
    7-10 us a step)."""

    takes_rate: bool
    samples_average: bool
    stats_shapes: tuple[tuple[int, ...], ...]
    fresh_rows: bool = False

    @property
    def sizes(self) -> list[int]:
        sizes = [1] if self.takes_rate else []
        sizes += [2] if self.samples_average else []
        sizes += [1] if self.fresh_rows else []
        return sizes + [int(np.prod(shape, dtype=np.int64)) for shape in self.stats_shapes]

    @property
    def used(self) -> bool:
        return bool(self.sizes)

    def unpack(self, controls: tf.Tensor) -> Controls:
        """In the graph: the controls, each in its shape."""
        parts = tf.split(controls, self.sizes)
        rate = parts.pop(0)[0] if self.takes_rate else None
        sampled = parts.pop(0) if self.samples_average else None
        fresh = tf.cast(parts.pop(0)[0], tf.int32) if self.fresh_rows else None
        stats = tuple(
            tf.reshape(part, shape) for part, shape in zip(parts, self.stats_shapes, strict=True)
        )
        return Controls(rate, sampled, fresh, stats)


class Controls(NamedTuple):
    """The controls of one step, in the graph."""

    rate: tf.Tensor | None  # the learning rate (None where the step takes none)
    sampled: tf.Tensor | None  # the averaged weights' rows: (scored, stride); None: every row
    fresh: tf.Tensor | None  # with experts: the batch's new rows, leading (None: every row)
    stats: tuple  # each scaling layer's statistics after this step (mean, std, ...)


@dataclass(frozen=True, slots=True)
class ExpertsRule:
    """How the experts learn and are mixed (``experts`` settings), and the loss's kind, which
    says what an expert's error is: a wrong class for ``binary``, ``categorical`` and
    ``sparse``, the absolute error for ``regression``."""

    kind: str
    decay: float
    rate: float
    linear_learning_rate: float
    linear_rows: int


@dataclass(slots=True)
class StepVariables:
    """Everything a step changes, and the device-side copies it restores from."""

    state: list  # the trainable variables and the optimizer's
    backup: list  # a copy of ``state`` taken before each update (a bad update's rollback)
    averages: list  # the averaged weights (``train.weight_average``), else empty
    averaged: tf.Variable  # how many updates they average
    # The model's other variables (scaling statistics, batch normalisation's moving statistics,
    # dropout's seed state), which the forward pass itself may move: copied at the start of
    # every step, put back when the step is not applied and by a rewind.
    others: list
    others_backup: list
    copies: list  # (copy, variable): what a rewind puts back (the averages where rewindable)

    @classmethod
    def create(
        cls,
        model: keras.Model,
        placement: Placement,
        weight_average: float,
        rewindable: bool,
        optimized: Sequence[tf.Variable] | None = None,
    ) -> StepVariables:
        """The variables of ``model``'s step, created in ``placement``'s scope; the model's
        optimizer trains ``optimized`` (default: every trainable variable)."""
        optimizer = model.optimizer
        with placement.scope():
            optimizer.build(model.trainable_variables if optimized is None else list(optimized))
            state = [*model.trainable_variables, *optimizer.variables]
            backup = [_copy(v, f"backup_{i}") for i, v in enumerate(state)]
            averages = (
                [_copy(v, f"average_{i}") for i, v in enumerate(model.trainable_variables)]
                if weight_average > 0
                else []
            )
            averaged = tf.Variable(0.0, trainable=False, name="averaged_steps")
            trained = {id(v) for v in model.trainable_variables}
            others = [v for v in model.variables if id(v) not in trained]
            others_backup = [_copy(v, f"others_{i}") for i, v in enumerate(others)]
            # Where rewindable, the averaged weights and their count are copied before an
            # update too, so that a rewind undoes the last applied step whole.
            beyond = [*averages, averaged] if rewindable else []
            beyond_backup = [_copy(v, f"rewind_{i}") for i, v in enumerate(beyond)]
        copies = [*zip(backup, state, strict=True), *zip(beyond_backup, beyond, strict=True)]
        return cls(state, backup, averages, averaged, others, others_backup, copies)

    def save_others(self) -> None:
        for saved, variable in zip(self.others_backup, self.others, strict=True):
            saved.assign(variable)

    def restore_others(self) -> tf.Tensor:
        for saved, variable in zip(self.others_backup, self.others, strict=True):
            variable.assign(saved)
        return tf.constant(False)

    def take_copies(self) -> None:
        """Copy what a rewind puts back: the state and, where rewindable, the average."""
        for saved, variable in self.copies:
            saved.assign(variable)

    def restore_state(self) -> tf.Tensor:
        """Put the state back as it was before the update (a rolled-back step)."""
        for saved, variable in zip(self.backup, self.state, strict=True):
            variable.assign(saved)
        return tf.constant(False)

    def rewind(self) -> None:
        for saved, variable in self.copies:
            variable.assign(saved)
        self.restore_others()


class ExpertsGraph:
    """The experts' parts of a step (``livefit.models.experts``): the linear expert's fit on
    the batch's new rows, each expert's errors on them, the linear expert's plain SGD update,
    and the mixture's move towards the experts with the smaller recent errors."""

    def __init__(self, model: keras.Model, rule: ExpertsRule, scaler: Standardize | None):
        mixture = mixture_layer(model)
        view = experts_view(model)
        linear = linear_expert_model(model)
        if mixture is None or view is None or linear is None:
            raise ValueError(f"model {model.name} was not built with experts")
        self.mixture: Mixture = mixture
        self.view = view
        self.linear = linear
        self.rule = rule
        self.scaler = scaler
        self.count = len(mixture.experts)
        linear_ids = {id(v) for v in linear.trainable_variables}
        self.is_linear = [id(v) in linear_ids for v in model.trainable_variables]
        features = int(np.prod(model.inputs[0].shape[1:]))
        # LMS is stable below 2 / |x|^2, about 2 / features on standardized inputs
        self.linear_rate = min(rule.linear_learning_rate, 1.0 / features)

    def linear_objective(
        self,
        x: tf.Tensor,
        target: tf.Tensor,
        fresh_w: tf.Tensor,
        fresh: tf.Tensor,
        stats: Sequence[tf.Tensor],
        per_sample: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    ) -> tf.Tensor:
        """What the linear expert's gradient is of: the summed loss of the new rows, as far as
        ``linear_rows`` per-sample steps go, on the inputs standardized with the statistics
        after this batch (a fresh model's first batch would otherwise fit raw inputs)."""
        inputs = x
        if self.scaler is not None:
            mean, std = stats[0], stats[1]
            inputs = (x - mean) / std
        losses = per_sample(target, self.linear(inputs, training=True))
        fresh_rows = tf.cast(tf.maximum(fresh, 1), tf.float32)
        scale = tf.minimum(fresh_rows, float(self.rule.linear_rows)) / fresh_rows
        return tf.reduce_sum(losses * fresh_w) * scale

    def errors(
        self,
        outputs: Sequence[tf.Tensor],
        target: tf.Tensor,
        fresh_w: tf.Tensor,
        per_sample: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    ) -> tf.Tensor:
        """Each expert's summed error over the new rows (weighted), and their weight: a vector
        of ``count + 1`` values."""
        rows = [tf.minimum(self._per_row(out, target, per_sample), ERROR_CAP) for out in outputs]
        sums = [tf.reduce_sum(errors * fresh_w) for errors in rows]
        return tf.stack([*sums, tf.reduce_sum(fresh_w)])

    def _per_row(
        self,
        out: tf.Tensor,
        target: tf.Tensor,
        per_sample: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    ) -> tf.Tensor:
        """A classifier's wrong predictions plus ``LOSS_SHARE`` times its loss; a regressor's
        absolute error (each averaged over further output axes)."""
        kind = self.rule.kind
        if kind == "regression":
            return _row_mean(tf.abs(out - target))
        if kind == "binary":
            wrong = tf.not_equal(out > 0.5, target > 0.5)
        elif kind == "categorical":
            wrong = tf.not_equal(tf.argmax(out, axis=-1), tf.argmax(target, axis=-1))
        else:  # class indices, in the shape of the predicted classes
            predicted = tf.argmax(out, axis=-1)
            classes = tf.reshape(tf.cast(target, tf.int64), tf.shape(predicted))
            wrong = tf.not_equal(predicted, classes)
        return _row_mean(tf.cast(wrong, tf.float32)) + LOSS_SHARE * per_sample(target, out)

    def apply_linear(self, grads: Sequence[tf.Tensor], variables: Sequence[tf.Variable]) -> None:
        """Plain SGD on the linear expert, where its gradients are finite (else it keeps its
        weights, and the network still learns)."""
        finite = tf.constant(True)
        for grad in grads:
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))

        def step() -> tf.Tensor:
            for grad, variable in zip(grads, variables, strict=True):
                variable.assign_sub(self.linear_rate * grad)
            return tf.constant(True)

        tf.cond(finite, step, lambda: tf.constant(False))

    def move_mixture(self, errors: tf.Tensor) -> tf.Tensor:
        """Discount the recent errors by the new rows' weight and add theirs; each expert's
        share becomes proportional to exp(-rate * its recent error) (Hedge)."""
        mixture = self.mixture
        weight = errors[-1]
        kept = tf.pow(tf.constant(self.rule.decay, tf.float32), weight)
        recent = mixture.recent_error * kept + errors[:-1]
        mixture.recent_error.assign(recent)
        mixture.recent_samples.assign(mixture.recent_samples * kept + weight)
        mixture.share.assign(tf.nn.softmax(-self.rule.rate * recent))
        return tf.constant(True)

    def report(self) -> tf.Tensor:
        """Each expert's share, then its recent error per sample."""
        mixture = self.mixture
        per_sample = mixture.recent_error / tf.maximum(mixture.recent_samples, 1e-12)
        return tf.concat([mixture.share, per_sample], 0)


class Forward(NamedTuple):
    """One forward and backward pass over a batch (or one replica's slice of it)."""

    loss: tf.Tensor  # what the gradients are of (fitted to standardized targets, if scaled)
    reported: tf.Tensor  # the loss in the user's units
    losses: tf.Tensor  # per-sample losses of the scored predictions
    pred: tf.Tensor  # the training forward pass's predictions (in the user's units)
    out: tf.Tensor  # the scored predictions (the training pass's where it doubles as them)
    grads: list
    extras: tuple  # with averaging: the averaged weights' (losses, predictions); else ()
    errors: tf.Tensor | None = None  # with experts: ``ExpertsGraph.errors``


class StepGraph:
    """The functions one training step is made of, over one compiled Keras model's variables;
    ``step_function`` composes them into the ``tf.function`` the trainer calls."""

    def __init__(
        self,
        model: keras.Model,
        loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        variables: StepVariables,
        placement: Placement,
        rate_variable: keras.Variable | None,
        weight_average: float,
        experts: ExpertsRule | None = None,
    ) -> None:
        self.model = model
        self.weight_average = weight_average
        self.loss_fn = loss_fn
        self.variables = variables
        self.placement = placement
        self.rate_variable = rate_variable
        self.optimizer = model.optimizer
        self.scaler: Standardize | None = standardize_layer(model)
        self.target: Unstandardize | None = target_scaling_layer(model)
        # With target scaling: (standardized output, output), what the loss fits beside the
        # prediction in the user's units
        self.view = standardized_view(model)
        self.separate_eval = not behaves_same_in_training(model)
        self.replicas = placement.replicas
        self.experts = None if experts is None else ExpertsGraph(model, experts, self.scaler)
        # which trainable variables are the linear expert's (plain SGD), and the optimizer's
        self.is_linear = (
            [False] * len(model.trainable_variables)
            if self.experts is None
            else self.experts.is_linear
        )
        self.optimized = [
            v
            for v, linear in zip(model.trainable_variables, self.is_linear, strict=True)
            if not linear
        ]
        stats_shapes = tuple(
            tuple(layer.stats_shape)
            for layer in (self.scaler, self.target)
            if layer is not None
            for _ in ("mean", "std")
        )
        self.layout = ControlLayout(
            takes_rate=rate_variable is not None,
            samples_average=bool(variables.averages) and self.replicas == 1,
            stats_shapes=stats_shapes,
            fresh_rows=self.experts is not None,
        )

    # The parts of a step

    def per_sample(self, y: tf.Tensor, pred: tf.Tensor) -> tf.Tensor:
        """The loss of each sample (averaged over any further output axes)."""
        values = self.loss_fn(y, pred)
        rank = len(values.shape)
        return values if rank == 1 else tf.reduce_mean(values, axis=list(range(1, rank)))

    def layer_losses(self) -> tf.Tensor:
        """The layers' own losses; each replica adds its share, so the summed gradients count
        them once."""
        total = tf.add_n(self.model.losses)
        return total if self.replicas == 1 else total / self.replicas

    def forward(
        self,
        x: tf.Tensor,
        y: tf.Tensor,
        w: tf.Tensor,
        rows: tf.Tensor,
        stats: Sequence[tf.Tensor],
        sampled: tf.Tensor | None = None,
        fresh_w: tf.Tensor | None = None,
        fresh: tf.Tensor | None = None,
    ) -> Forward:
        """The loss over ``rows`` samples (of which these are some), its gradients, the
        per-sample scores and the predictions; with averaging, the averaged weights' scores of
        the rows ``sampled`` picks (scored rows and stride; None: every row); with experts,
        each one's errors on the new rows (``fresh`` of them, weighed by ``fresh_w``), which
        the linear expert also fits."""
        model = self.model
        experts = self.experts
        scorer = model if experts is None else experts.view
        scored = scorer(x, training=False) if self.separate_eval else None
        target = y
        if self.target is not None:  # fitted to the targets standardized as after this step
            target_mean, target_std = stats[-2:]
            target = (y - target_mean) / target_std
        with tf.GradientTape() as tape:
            if experts is not None:
                *outputs, pred = experts.view(x, training=True)
                fitted = self.per_sample(target, outputs[0])
            elif self.view is not None:
                standardized, pred = self.view(x, training=True)
                fitted = self.per_sample(target, standardized)
            else:
                pred = model(x, training=True)
                fitted = self.per_sample(y, pred)
            loss = tf.reduce_sum(fitted * w) / rows
            if model.losses:
                loss += self.layer_losses()
            objective = loss
            if experts is not None:
                assert fresh_w is not None and fresh is not None
                objective += experts.linear_objective(
                    x, target, fresh_w, fresh, stats, self.per_sample
                )
        grads = tape.gradient(objective, model.trainable_variables)
        if self.view is not None or experts is not None:  # the served output, user's units
            losses = self.per_sample(y, pred)
            reported = tf.reduce_sum(losses * w) / rows
            if model.losses:
                reported += self.layer_losses()
        else:
            losses, reported = fitted, loss
        errors = None
        if scored is not None:
            if experts is not None:
                *outputs, scored = scored
            losses = self.per_sample(y, scored)
        if experts is not None:
            assert fresh_w is not None
            errors = experts.errors(outputs, target, fresh_w, self.per_sample)
        out = scored if scored is not None else pred
        extras: tuple = ()
        if self.variables.averages:
            extras = self.sampled_average_scores(x, y, sampled, losses, out)
        return Forward(loss, reported, losses, pred, out, grads, extras, errors)

    def average_scores(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The averaged weights' per-sample losses and predictions (before the update)."""
        model = self.model
        averaged_out, _ = model.stateless_call(
            [a.value() for a in self.variables.averages],
            [v.value for v in model.non_trainable_variables],
            x,
            training=False,
        )
        return self.per_sample(y, averaged_out), averaged_out

    def sampled_average_scores(
        self,
        x: tf.Tensor,
        y: tf.Tensor,
        sampled: tf.Tensor | None,
        losses: tf.Tensor,
        out: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """``average_scores`` of the rows ``sampled`` picks: 0 to its first value in steps of
        its second (None: every row)."""
        if sampled is None:
            return self.average_scores(x, y)
        rows_scored = tf.cast(sampled[0], tf.int32)
        index = tf.range(0, rows_scored, tf.cast(sampled[1], tf.int32))
        # No rows (a batch's later steps): no forward pass on an empty batch, which some
        # kernels (cuDNN's recurrent ones) have refused.
        return tf.cond(
            rows_scored > 0,
            lambda: self.average_scores(tf.gather(x, index), tf.gather(y, index)),
            lambda: (tf.zeros_like(losses[:0]), tf.zeros_like(out[:0])),
        )

    def update(
        self,
        forward: Forward,
        stats: Sequence[tf.Tensor],
        rate: tf.Tensor | None,
        mirrored: list | None = None,
    ) -> tf.Tensor:
        """Apply the gradients (their ``mirrored`` copies, one per device, where given) at
        learning rate ``rate`` (None: the optimizer's own) if everything is finite, then the
        new statistics and the experts' mixture; put the other variables back where it did
        not apply. True when applied."""
        # The reported loss and the predictions too: with target scaling the fitted loss can
        # be finite while the prediction in the user's units is not. The linear expert's
        # gradients are checked on their own (``ExpertsGraph.apply_linear``).
        finite = tf.logical_and(
            tf.math.is_finite(forward.loss), tf.math.is_finite(forward.reported)
        )
        finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(forward.pred)))
        for grad, linear in zip(forward.grads, self.is_linear, strict=True):
            if not linear:
                finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))
        grads = forward.grads if mirrored is None else mirrored
        applied = tf.cond(finite, lambda: self.apply(grads, rate), lambda: tf.constant(False))
        if stats:  # after the forward pass: this batch used the old statistics
            tf.cond(applied, lambda: self.set_statistics(stats), lambda: tf.constant(False))
        if self.experts is not None and forward.errors is not None:
            experts, errors = self.experts, forward.errors
            tf.cond(applied, lambda: experts.move_mixture(errors), lambda: tf.constant(False))
        tf.cond(applied, lambda: tf.constant(True), self.variables.restore_others)
        return applied

    def apply(self, grads: list, rate: tf.Tensor | None) -> tf.Tensor:
        """Apply the update at ``rate`` (the linear expert's by plain SGD); if any new value
        is not finite, restore the state before it (the previous rate included)."""
        self.variables.take_copies()
        if rate is not None and self.rate_variable is not None:
            self.rate_variable.assign(rate)
        trainable = self.model.trainable_variables
        pairs = list(zip(grads, trainable, self.is_linear, strict=True))
        self.optimizer.apply([g for g, _, linear in pairs if not linear], self.optimized)
        if self.experts is not None:
            linear_pairs = [(g, v) for g, v, linear in pairs if linear]
            self.experts.apply_linear([g for g, _ in linear_pairs], [v for _, v in linear_pairs])
        ok = tf.constant(True)
        for variable in trainable:
            ok = tf.logical_and(ok, tf.reduce_all(tf.math.is_finite(variable)))
        kept = self.average if self.variables.averages else lambda: tf.constant(True)
        return tf.cond(ok, kept, self.variables.restore_state)

    def average(self) -> tf.Tensor:
        """Move the averaged weights towards the new ones: an exponential moving average with
        decay ``weight_average``, debiased at the start (decay t / (AVERAGE_START + t) at the
        t-th update while that is smaller), so the average follows a fresh model's first
        steps."""
        t = self.variables.averaged.assign_add(1.0)
        decay = tf.minimum(self.weight_average, t / (AVERAGE_START + t))
        for mean, variable in zip(
            self.variables.averages, self.model.trainable_variables, strict=True
        ):
            mean.assign(decay * mean + (1.0 - decay) * variable)
        return tf.constant(True)

    def set_statistics(self, stats: Sequence[tf.Tensor]) -> tf.Tensor:
        """Assign the scaling layers' new statistics (mean, std, in the layers' order)."""
        layers = [layer for layer in (self.scaler, self.target) if layer is not None]
        pairs = [stats[i : i + 2] for i in range(0, len(stats), 2)]
        for layer, (mean, std) in zip(layers, pairs, strict=True):
            layer.mean.assign(mean)
            layer.std.assign(std)
        return tf.constant(True)

    def packed(
        self,
        reported: tf.Tensor,
        applied: tf.Tensor,
        losses: tf.Tensor,
        out: tf.Tensor,
        extras: tuple,
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Three outputs instead of up to six (each one the trainer's thread reads back costs
        it a tensor and a copy): the loss and whether the step applied as float32 values,
        followed with experts by each one's share and recent error (``ExpertsGraph.report``);
        the per-sample losses of the trained weights followed by the averaged ones' where
        averaging (which may score fewer rows); their predictions likewise."""
        scalars = tf.stack([tf.cast(reported, tf.float32), tf.cast(applied, tf.float32)])
        if self.experts is not None:
            scalars = tf.concat([scalars, self.experts.report()], 0)
        if not extras:
            return scalars, losses, out
        average_losses, average_out = extras
        return scalars, tf.concat([losses, average_losses], 0), tf.concat([out, average_out], 0)

    # The compiled functions

    def _signature(
        self, input_shape: Sequence[int], target_shape: Sequence[int]
    ) -> list[tf.TensorSpec]:
        signature = [
            tf.TensorSpec([None, *input_shape], tf.float32, name="x"),
            tf.TensorSpec([None, *target_shape], tf.float32, name="y"),
            tf.TensorSpec([None], tf.float32, name="w"),
        ]
        if self.replicas > 1:  # the real rows of a batch padded to a multiple of the replicas
            signature.append(tf.TensorSpec([], tf.float32, name="rows"))
        if self.layout.used:
            signature.append(tf.TensorSpec([sum(self.layout.sizes)], tf.float32, name="controls"))
        return signature

    def step_function(
        self, input_shape: Sequence[int], target_shape: Sequence[int]
    ) -> tf.types.experimental.PolymorphicFunction:
        """The step as one ``tf.function`` with a ``None`` batch dimension: on one device, or
        each replica's forward and backward pass under the placement's strategy, then the
        update once."""
        signature = self._signature(input_shape, target_shape)
        if self.placement.strategy is None:
            return tf.function(self._one_device, input_signature=signature, autograph=False)
        return tf.function(self._mirrored, input_signature=signature, autograph=False)

    def _controls(self, inputs: tuple[tf.Tensor, ...]) -> Controls:
        if not self.layout.used:
            return Controls(None, None, None, ())
        return self.layout.unpack(inputs[0])

    @staticmethod
    def _fresh_weights(w: tf.Tensor, fresh: tf.Tensor | None) -> tf.Tensor:
        """``w`` on the batch's leading ``fresh`` rows, 0 on the others (None: every row)."""
        if fresh is None:
            return w
        return w * tf.cast(tf.range(tf.shape(w)[0]) < fresh, w.dtype)

    def _one_device(self, x: tf.Tensor, y: tf.Tensor, w: tf.Tensor, *inputs: tf.Tensor):
        controls = self._controls(inputs)
        self.variables.save_others()
        rows = tf.cast(tf.shape(x)[0], tf.float32)
        fresh = None
        if self.experts is not None:
            fresh = controls.fresh if controls.fresh is not None else tf.shape(x)[0]
        forward = self.forward(
            x, y, w, rows, controls.stats, controls.sampled,
            self._fresh_weights(w, fresh), fresh,
        )  # fmt: skip
        applied = self.update(forward, controls.stats, controls.rate)
        return self.packed(forward.reported, applied, forward.losses, forward.out, forward.extras)

    def _mirrored(self, x: tf.Tensor, y: tf.Tensor, w: tf.Tensor, rows: tf.Tensor, *inputs):
        """The replicas' forward and backward passes, then the update once, across replicas:
        rollback, statistics and the experts' mixture as on one device, every copy alike."""
        strategy = self.placement.strategy
        assert strategy is not None  # step_function picks this step for a strategy only
        replicas = self.replicas
        controls = self._controls(inputs)
        stats = controls.stats
        self.variables.save_others()
        experts = self.experts is not None
        fresh = controls.fresh if controls.fresh is not None else tf.cast(rows, tf.int32)
        fresh_w = self._fresh_weights(w, fresh) if experts else w

        def on_replica(x, y, w, fresh_w, rows, *stats):
            part = [replica_slice(t, replicas) for t in (x, y, w, fresh_w)]
            xs, ys, ws, fresh_ws = part
            if not experts:  # no errors: a None is no value a replica can return
                return tuple(self.forward(xs, ys, ws, rows, stats))[:-1]
            return tuple(self.forward(xs, ys, ws, rows, stats, None, fresh_ws, fresh))

        def gathered(values) -> tf.Tensor:
            return tf.concat(strategy.experimental_local_results(values), axis=0)

        results = strategy.run(on_replica, args=(x, y, w, fresh_w, rows, *stats))
        loss, reported, losses, pred, out, grads, extras = results[:7]
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
        reported = strategy.reduce(tf.distribute.ReduceOp.SUM, reported, axis=None)
        errors = None
        if experts:
            errors = strategy.reduce(tf.distribute.ReduceOp.SUM, results[7], axis=None)
        pred = gathered(pred)[: tf.cast(rows, tf.int32)]
        pairs = [(g, v.value) for g, v in zip(grads, self.model.trainable_variables, strict=True)]
        # Summed onto each variable's devices (all-reduce), not through one device.
        summed = strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs)
        checked = [strategy.experimental_local_results(g)[0] for g in summed]
        forward = Forward(loss, reported, losses, pred, out, checked, (), errors)
        applied = self.update(forward, stats, controls.rate, summed)
        averaged = tuple(gathered(e) for e in extras)
        return self.packed(reported, applied, gathered(losses), gathered(out), averaged)

    def rewind_function(self) -> tf.types.experimental.PolymorphicFunction:
        def rewind() -> tf.Tensor:
            self.variables.rewind()
            return tf.constant(True)

        return tf.function(rewind, input_signature=[], autograph=False)

    def keep_function(self) -> tf.types.experimental.PolymorphicFunction:
        """Copy everything a rewind restores into its copies: a rewind right after is then
        the identity (``TrainStep.warm_up`` runs the pair once)."""

        def keep() -> tf.Tensor:
            self.variables.take_copies()
            self.variables.save_others()
            return tf.constant(True)

        return tf.function(keep, input_signature=[], autograph=False)

    def restart_average_function(self) -> tf.types.experimental.PolymorphicFunction:
        """Restart the average from the current weights."""

        def restart_average() -> tf.Tensor:
            for mean, variable in zip(
                self.variables.averages, self.model.trainable_variables, strict=True
            ):
                mean.assign(variable)
            self.variables.averaged.assign(0.0)
            return tf.constant(True)

        return tf.function(restart_average, input_signature=[], autograph=False)


def _row_mean(values: tf.Tensor) -> tf.Tensor:
    """``values`` averaged over every axis but the first."""
    rank = len(values.shape)
    return values if rank == 1 else tf.reduce_mean(values, axis=list(range(1, rank)))


def _copy(variable: tf.Variable, name: str) -> tf.Variable:
    return tf.Variable(variable, trainable=False, name=name)
