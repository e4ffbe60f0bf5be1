"""Run as ``python -m tests.e2e.two_devices_steps``: the compiled step on one device against
the same step mirrored on two logical CPU devices, printed as one JSON document.

A process of its own because the CPU can only be split before TensorFlow initialises its
devices (``tests/e2e/test_devices.py`` runs it and checks the figures). For each model the
same seed builds both copies; both learn the same batches (sizes not divisible by two among
them) through the trainer's ``UpdatePolicy`` (the default steps a batch: four for the
regression models, two for the classifier; replay, scaling); a batch
with an infinite input must be rolled back on both; then the two swap their weights and
optimizer states, each restored on the other placement, and must predict what the other did.
"""

from __future__ import annotations

import json

from livefit.server.config.sections import TensorFlowSettings
from livefit.server.train.modeling import configure_tensorflow

configure_tensorflow(TensorFlowSettings(logical_cpu_devices=2))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from livefit.server.config.model import ModelSettings  # noqa: E402
from livefit.server.train.modeling import build_compiled, experts_rule, make_loss  # noqa: E402
from livefit.server.train.placement import Placement  # noqa: E402
from livefit.server.train.train_step import TrainStep  # noqa: E402
from livefit.server.train.update_policy import UpdatePolicy  # noqa: E402
from livefit.server.wire.samples import Batch  # noqa: E402

BATCH_SIZES = [7, 1, 8, 13, 3, 64, 5, 2]
MODELS = {
    "mlp-mse": {"builder": "mlp", "loss": "mse"},  # target scaling (auto for regression)
    "mlp-bce": {"builder": "mlp", "loss": "binary_crossentropy"},
    "linear-mse": {"builder": "linear", "loss": "mse"},
    # weight averaging (the averaged weights scored beside the trained ones: the step's
    # concatenated outputs) and a rewindable step (warm_up runs its copy and rewind, and the average's
    # restart, on the mirrored variables)
    "mlp-mse-averaged": {"builder": "mlp", "loss": "mse", "train": {"weight_average": 0.95}},
}
DROPOUT = {"builder": "mlp", "loss": "mse", "builder_options": {"dropout": 0.2}}


def batch(x: np.ndarray, y: np.ndarray) -> Batch:
    w = np.ones(len(x), np.float32)
    return Batch(x=x, y=y, w=w, chunks=1, oldest_published_at=None, newest_published_at=None)


def trainer_parts(
    settings: ModelSettings, device: str | Placement
) -> tuple[TrainStep, UpdatePolicy]:
    model = build_compiled(settings, device)
    average = "weight_average" in settings.train.model_fields_set
    step = TrainStep(
        model, make_loss(settings), [4], settings.resolved_target_shape(), device,
        weight_average=settings.train.weight_average if average else 0.0, rewindable=average,
        experts=experts_rule(settings),  # the default model: the network and a linear expert
    )  # fmt: skip
    step.warm_up()
    return step, UpdatePolicy(settings, step, seed=settings.seed)


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The largest difference, relative where a value is over 1: the experts' recent errors
    are sums of hundreds of samples', which the devices add up in another order."""
    return max(
        float(np.max(np.abs(u - v) / np.maximum(1.0, np.abs(v)), initial=0.0))
        for u, v in zip(a, b, strict=True)
    )


def compare(name: str, options: dict, two: Placement) -> dict:
    settings = ModelSettings(input_shape=[4], output_shape=[1], seed=5, **options)
    one_step, one_policy = trainer_parts(settings, "/CPU:0")
    two_step, two_policy = trainer_parts(settings, two)
    rng = np.random.default_rng(1)
    report: dict = {"losses": [], "predictions": [], "rows": []}
    report["default_steps"] = settings.resolved_steps_per_batch()
    for n in BATCH_SIZES:
        x = rng.normal(size=(n, 4)).astype(np.float32)
        if options["loss"] == "binary_crossentropy":
            y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
        else:
            y = (3.0 * x[:, :1] + 10.0).astype(np.float32)
        a, b = one_policy.learn(batch(x, y)), two_policy.learn(batch(x, y))
        report["losses"].append(abs(a.first.loss - b.first.loss) / max(abs(a.first.loss), 1e-6))
        report["predictions"].append(
            float(np.max(np.abs(a.first.predictions - b.first.predictions)))
        )
        report["rows"].append([len(a.first.predictions), len(b.first.predictions)])
        report.setdefault("steps", []).append([a.steps, b.steps])
    report["weights"] = largest_difference(
        one_step.model.get_weights(), two_step.model.get_weights()
    )
    report["optimizer"] = largest_difference(one_step.optimizer_state(), two_step.optimizer_state())
    if two_step.averaging:  # the averaged weights alike, and a step rewound whole
        report["average"] = largest_difference(
            list(one_step.average_state().values()), list(two_step.average_state().values())
        )
        kept = [*two_step.model.get_weights(), *two_step.average_state().values()]
        x = rng.normal(size=(5, 4)).astype(np.float32)
        assert two_step(x, x[:, :1], np.ones(5, np.float32)).applied
        two_step.rewind()
        after = [*two_step.model.get_weights(), *two_step.average_state().values()]
        report["rewound"] = largest_difference(kept, after) == 0.0
    # Every device's copy of every variable alike.
    report["copies_equal"] = all(
        all(np.array_equal(c.numpy(), v.value.values[0].numpy()) for c in v.value.values)
        for v in [*two_step.model.weights, *two_step.model.optimizer.variables]
    )
    # A non-finite batch is rolled back on both.
    before = two_step.model.get_weights()
    bad = np.full((3, 4), np.inf, np.float32)
    rolled = [
        p.learn(batch(bad, np.ones((3, 1), np.float32))).steps for p in (one_policy, two_policy)
    ]
    report["rolled_back"] = (
        rolled == [0, 0] and largest_difference(before, two_step.model.get_weights()) == 0.0
    )
    report["traces"] = [one_step.traces, two_step.traces]
    report["names_one"] = [v.path for v in one_step.model.weights]
    report["names_two"] = [v.path for v in two_step.model.weights]
    report.update(restored_across(one_step, two_step, rng.normal(size=(9, 4)).astype(np.float32)))
    return report


def restored_across(one_step: TrainStep, two_step: TrainStep, probe: np.ndarray) -> dict:
    """Each one's state restored on the other placement predicts what it predicted, and
    holds its optimizer state: the two steps swap states, after one more step of the
    one-device copy alone, so that a restore keeping anything of the target's own would show
    (no fresh model is built for it: 8 fewer steps to trace here). The differences:
    ``two_to_one`` and ``one_to_two``, with their optimizers'."""
    assert one_step(probe, probe[:, :1], np.ones(len(probe), np.float32)).applied
    saved = {
        "one": (one_step.model.get_weights(), one_step.optimizer_state(),
                np.asarray(one_step.model(probe, training=False))),
        "two": (two_step.model.get_weights(), two_step.optimizer_state(),
                np.asarray(two_step.model(probe, training=False))),
    }  # fmt: skip
    report = {}
    for source, target, label in (("two", one_step, "two_to_one"), ("one", two_step, "one_to_two")):
        weights, optimizer_state, predicted = saved[source]
        target.restore(weights, optimizer_state)
        report[label] = float(np.max(np.abs(predicted - target.model(probe, training=False))))
        report[f"{label}_optimizer"] = largest_difference(optimizer_state, target.optimizer_state())
    return report


def dropout_trains(two: Placement) -> bool:
    """A model that behaves differently in training (a separate scoring pass) steps too."""
    settings = ModelSettings(input_shape=[4], output_shape=[1], seed=5, **DROPOUT)
    _, policy = trainer_parts(settings, two)
    x = np.random.default_rng(2).normal(size=(7, 4)).astype(np.float32)
    learned = policy.learn(batch(x, x[:, :1]))
    return learned.steps > 0 and learned.first.predictions.shape == (7, 1)


def regularized(two: Placement) -> float:
    """A network with a layer loss (L2): each device adds its share, the sum counts it once;
    the largest weight difference after the same steps on one and two devices."""
    steps = []
    for device in ("/CPU:0", two):
        placement = device if isinstance(device, Placement) else Placement([device])
        with placement.scope():
            keras.utils.set_random_seed(3)
            model = keras.Sequential([
                keras.Input((4,)),
                keras.layers.Dense(8, activation="tanh", kernel_regularizer="l2"),
                keras.layers.Dense(1),
            ])  # fmt: skip
            model.compile(optimizer=keras.optimizers.Nadam(0.01), loss="mse")
        steps.append(TrainStep(model, keras.losses.get("mse"), [4], [1], device))
    rng = np.random.default_rng(4)
    for n in BATCH_SIZES:
        x = rng.normal(size=(n, 4)).astype(np.float32)
        w = np.ones(n, np.float32)
        for step in steps:
            step(x, x[:, :1], w)
    return largest_difference(steps[0].model.get_weights(), steps[1].model.get_weights())


def main() -> None:
    two = Placement(["/CPU:0", "/CPU:1"])
    results = {name: compare(name, options, two) for name, options in MODELS.items()}
    results["dropout_trains"] = dropout_trains(two)
    results["regularized"] = regularized(two)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
