"""Candidate default changes against the defaults, in process, on every learning stream.

    .venv/bin/python -m bench.learning.variants --variants base,ema99 [--seeds 1,2,3,7]
        [--streams waveform,led] [--limit N] [--chunk 25] [--out rows.jsonl]

Each variant is livefit's defaults (the configuration a user writes: shapes and loss) plus a
few settings (``VARIANTS``); every one runs on the same samples and model seeds through the
trainer's own code path (``inprocess.learn_inprocess``). Rows go out as JSON lines (append to
``--out``), one per stream, seed and variant; ``--summary rows.jsonl`` prints, per stream,
each variant's mean and worst change against ``base`` (``--reference`` names another:
accuracy points, or % lower MAE: higher is better) and its samples/s relative to it;
``--figure after_first``: of the figure after each stream's first message (what a served
model's clients got once every message is one batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from bench.learning.inprocess import learn_inprocess
from bench.learning.knobs import Knobs
from bench.learning.streams import CHUNK, METRIC, STREAMS, load_stream

# Settings merged into the model's table, by section ("" for the top level; "module": the
# weight-averaging constants of livefit.server.train, set before each trainer is built).
# "base" is the defaults before weight averaging (issue #30): what the others are measured
# against. The rows that served the average always ("ema*" in bench/results/averaging.jsonl)
# came from a first version of the step without the choice by windowed loss; "decay*" from an
# lr / sqrt(1 + steps / T) schedule not kept (neither is reproducible with this code). "wd05"
# and "wd2": the default optimizer with Keras' decoupled weight decay 0.05 and 0.2, not kept
# (bench/results/weight_decay.jsonl, measured against "ch95", the defaults). "EPSILON": the
# optimizer's epsilon (Keras' default 1e-7).
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "base": {"train": {"weight_average": 0.0}},
    "ch90": {"train": {"weight_average": 0.9}},
    "ch95": {"train": {"weight_average": 0.95}},  # the default
    "ch99": {"train": {"weight_average": 0.99}},
    "ch95w200": {"train": {"weight_average": 0.95}, "module": {"AVERAGE_WINDOW": 200}},
    "defaults": {},
    # The defaults without the experts (issue #47: the network alone, as before them)
    "noexp": {"experts": {"enabled": False}},
    # The experts' mixture sharper (rate), or following a shorter window (decay)
    "exprate3": {"experts": {"rate": 3.0}},
    "exprate03": {"experts": {"rate": 0.3}},
    "exprate01": {"experts": {"rate": 0.1}},
    "exprate05": {"experts": {"rate": 0.5}},
    "expdecay995": {"experts": {"decay": 0.995}},
    "expdecay999": {"experts": {"decay": 0.999}},
    # The fast start (train.fast_start_samples, issue #30): off, and its smallest batch 1 or 10
    # instead of 5 (bench/results/fast_start.jsonl).
    "nofast": {"train": {"fast_start_samples": 0}},
    "fastmin1": {"module": {"FAST_START_MIN_BATCH": 1}},
    "fastmin10": {"module": {"FAST_START_MIN_BATCH": 10}},
    "wd05": {"module": {"WEIGHT_DECAY": 0.05}},
    "wd2": {"module": {"WEIGHT_DECAY": 0.2}},
    "ch95s29": {"train": {"weight_average": 0.95}, "module": {"AVERAGE_START": 29.0}},
    # The two probes that helped Waveform most (docs/benchmarks/learning.md, "What the fast start
    # buys"), over every stream (bench/results/waveform_probes.jsonl): one hidden layer of 32
    # units, and half the learning rate.
    "h32": {"": {"builder_options": {"hidden_units": [32]}}},
    "lr005": {"": {"learning_rate": 0.005}},
    # Half the learning rate, won back after a detected drift: drift.reaction "recover" (the
    # replay emptied, the rate boosted 3x and decaying back over 200 steps).
    "lr005rec": {"": {"learning_rate": 0.005}, "drift": {"reaction": "recover"}},
    # A classifier's replay window at 1,000 and 2,000 samples (the default is 500; 2,000 for
    # regression), emptied on a detected drift as by default.
    "rep1000": {"train": {"replay_capacity": 1000}},
    "rep2000": {"train": {"replay_capacity": 2000}},
    # Waveform's ceiling (2026-11-27, bench/results/waveform_ceiling.jsonl): settings tuned to
    # Waveform alone, and what they do on Agrawal (abrupt). Plain SGD instead of Nadam (at 0.1,
    # and at 0.05 with 4 steps), Nadam at a fifth and a tenth of the rate, Nadam with a larger
    # epsilon (SGD-like where gradients are small), the linear builder with SGD.
    "sgd01": {"": {"optimizer": "sgd", "learning_rate": 0.1}},
    "sgd005s4": {"": {"optimizer": "sgd", "learning_rate": 0.05}, "train": {"steps_per_batch": 4}},
    "lr002": {"": {"learning_rate": 0.002}},
    "lr001rep2000fast": {
        "": {"learning_rate": 0.001},
        "train": {"replay_capacity": 2000, "fast_start_samples": 100},
    },
    "eps1e2": {"module": {"EPSILON": 1e-2}},
    "eps1e1": {"module": {"EPSILON": 1e-1}},
    "linsgd01": {"": {"builder": "linear", "optimizer": "sgd", "learning_rate": 0.1}},
    # The learning rate scaled by rows / 25 for a batch of fewer than 25 rows (not in livefit:
    # ``_set_small_batch_rate``), measured with --chunk 1, every sample its own batch, as
    # delayed labels arrive (docs/benchmarks/delayed_labels.md)
    "rate25": {"module": {"SMALL_BATCH_ROWS": 25}},
    # One gradient step per batch instead of two (four for regression), measured with --chunk 1
    # as "steps that suit single samples" (issue #47; docs/benchmarks/delayed_labels.md)
    "steps1": {"train": {"steps_per_batch": 1}},
    # eight instead: more of the replay learned with each label (docs/benchmarks/delayed_labels.md)
    "steps8": {"train": {"steps_per_batch": 8}},
}


# The trainer's own values of the constants a variant patches, read before the first patch, so
# that the next variant without the constant gets them back.
_TRAINER_CONSTANTS: dict[str, Any] = {}


@dataclass(frozen=True)
class Variant:
    """``knobs`` with extra settings merged into the table (what ``learn_inprocess`` needs)."""

    knobs: Knobs
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)

    def model_config(self, table: dict[str, Any]) -> dict[str, Any]:
        config = self.knobs.model_config(table)
        from livefit.server.train import step_graph, trainer, weight_choice

        module = self.extra.get("module", {})
        step_graph.AVERAGE_START = module.get("AVERAGE_START", 9.0)
        _set_optimizer_options(module.get("WEIGHT_DECAY"), module.get("EPSILON"))
        _set_small_batch_rate(module.get("SMALL_BATCH_ROWS"))
        weight_choice.AVERAGE_WINDOW = module.get("AVERAGE_WINDOW", 500)
        _TRAINER_CONSTANTS.setdefault("FAST_START_MIN_BATCH", trainer.FAST_START_MIN_BATCH)
        own = _TRAINER_CONSTANTS["FAST_START_MIN_BATCH"]
        trainer.FAST_START_MIN_BATCH = module.get("FAST_START_MIN_BATCH", own)
        for section, values in self.extra.items():
            if section == "module":
                continue
            if section:
                config[section] = {**config.get(section, {}), **values}
            else:
                config.update(values)
        return config


def _set_optimizer_options(decay: float | None, epsilon: float | None) -> None:
    """Experiment only: the trainer's optimizer built with Keras' decoupled ``weight_decay``
    and/or another ``epsilon`` (both None: livefit's own ``make_optimizer`` again)."""
    import keras

    from livefit.server.train import modeling

    original = getattr(modeling, "_livefit_make_optimizer", modeling.make_optimizer)
    modeling._livefit_make_optimizer = original  # type: ignore[attr-defined]
    if decay is None and epsilon is None:
        modeling.make_optimizer = original
        return
    options = {"weight_decay": decay, "epsilon": epsilon}

    def make_optimizer(settings):
        config = {"learning_rate": settings.learning_rate}
        config.update({k: v for k, v in options.items() if v is not None})
        return keras.optimizers.get({"class_name": settings.optimizer, "config": config})

    modeling.make_optimizer = make_optimizer


def _set_small_batch_rate(rows: int | None) -> None:
    """Experiment only: each batch of fewer than ``rows`` rows learns at its learning rate
    times len(batch) / ``rows`` (None: livefit's own ``UpdatePolicy`` again). Nadam's step
    moves the weights about as far on one sample as on a full batch; this makes a one-sample
    batch move them a ``rows``-th as far."""
    from livefit.server.train import learning_rate, update_policy

    policy, rate = update_policy.UpdatePolicy, learning_rate.LearningRate
    original = getattr(policy, "_livefit_originals", (policy.start, rate.after_step))
    policy._livefit_originals = original  # type: ignore[attr-defined]
    if rows is None:
        policy.start, rate.after_step = original  # type: ignore[method-assign]
        return
    start, _ = original

    def scaled_start(self, batch, extras_allowed=True):
        self.rate.small_batch_factor = min(1.0, len(batch) / rows)
        self.rate.set(self.rate.base * self.rate.factor * self.rate.small_batch_factor)
        started = start(self, batch, extras_allowed)
        self.rate.small_batch_factor = 1.0
        self.rate.set(self.rate.base * self.rate.factor)
        return started

    def scaled_after_step(self):
        if self.boost.left > 0:
            self.boost.left -= 1
            factor = getattr(self, "small_batch_factor", 1.0)
            self.set(self.base * self.boost.factor() * factor)

    policy.start, rate.after_step = scaled_start, scaled_after_step  # type: ignore[method-assign]


def run(
    variants: list[str],
    streams: list[str],
    seeds: list[int],
    limit: int | None,
    out,
    chunk: int = CHUNK,
):
    for name in streams:
        stream = load_stream(STREAMS[name], limit)
        metric = METRIC[stream.task]
        for seed in seeds:
            for variant in variants:
                knobs = Variant(Knobs(seed=seed), VARIANTS[variant])
                score = learn_inprocess(stream, knobs, chunk=chunk)
                row = {
                    "stream": name, "seed": seed, "variant": variant, "metric": metric,
                    "chunk": chunk,
                    "value": score.value(metric), "samples_per_s": score.samples / score.seconds,
                    "mae_after_first": score.mae_after_first_message,
                    "after_first": score.after_first_message,
                }  # fmt: skip
                line = json.dumps(row)
                print(line, flush=True)
                if out is not None:
                    out.write(line + "\n")
                    out.flush()


def summary(
    rows: list[dict[str, Any]], reference: str = "base", figure: str = "value"
) -> list[str]:
    """Per stream and variant: mean and worst change against ``reference`` over the seeds, of
    ``figure`` (``value``: the whole stream; ``after_first``: after the first message)."""
    if any(figure not in r for r in rows):
        raise ValueError(f"rows without {figure!r}: measured before it was recorded")
    rows = [{**r, "value": r[figure]} for r in rows]
    base = {(r["stream"], r["seed"]): r for r in rows if r["variant"] == reference}
    lines = []
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != reference]
    totals: dict[str, list[float]] = {v: [] for v in variants}
    for name in dict.fromkeys(r["stream"] for r in rows):
        cells = []
        for variant in variants:
            changes, speeds = [], []
            for r in rows:
                b = base.get((r["stream"], r["seed"]))
                if r["stream"] != name or r["variant"] != variant or b is None:
                    continue
                if r["metric"] == "accuracy":
                    changes.append(100 * (r["value"] - b["value"]))
                else:
                    changes.append(100 * (b["value"] - r["value"]) / b["value"])
                speeds.append(r["samples_per_s"] / b["samples_per_s"])
            if changes:
                totals[variant] += changes
                cells.append(
                    f"{variant} {statistics.fmean(changes):+.2f} ({min(changes):+.2f}) "
                    f"x{statistics.fmean(speeds):.2f} n{len(changes)}"
                )
        lines.append(f"{name:<16} " + " | ".join(cells))
    lines.append(
        "all              "
        + " | ".join(f"{v} {statistics.fmean(t):+.3f}" for v, t in totals.items() if t)
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="base")
    parser.add_argument("--streams", default=",".join(STREAMS))
    parser.add_argument("--seeds", default="1,2,3,7")
    parser.add_argument("--limit", type=int, default=None, help="samples per stream")
    parser.add_argument("--chunk", type=int, default=CHUNK, help="samples per batch")
    parser.add_argument("--out", default=None, help="append rows (JSON lines) here")
    parser.add_argument("--summary", default=None, help="summarize these rows instead")
    parser.add_argument("--reference", default="base", help="the variant --summary compares to")
    parser.add_argument(
        "--figure", default="value", choices=("value", "after_first"),
        help="--summary of the whole stream's figure or of the one after the first message",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.summary:
        with open(args.summary) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        print("\n".join(summary(rows, args.reference, args.figure)))
        return 0
    out = open(args.out, "a") if args.out else None  # noqa: SIM115
    try:
        run(args.variants.split(","), args.streams.split(","),
            [int(s) for s in args.seeds.split(",")], args.limit, out, args.chunk)  # fmt: skip
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
