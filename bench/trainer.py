"""Benchmark 1, trainer: livefit's queue -> dynamic minibatch -> step, against the hardware limit.

In one process, on the same MLP (same builder, seed, optimizer and loss), for each batch size:

* **livefit**: a real ``Trainer`` with its ``SampleQueue``, pre-filled in memory with chunks of
  1 sample (what single-sample messages give it) or 100 samples (batched messages); timed from
  ``start()`` until ``stop()`` returned, i.e. every queued sample trained (prequential scoring,
  metrics and weight snapshots included). In this process (2 or more CPUs, no serving) the
  default ``train.pipeline = "auto"`` pipelines its steps; **no pipeline** is the same with
  ``"off"``, one batch after the other. This process sizes TensorFlow's pools as livefit sizes
  those of a process that trains and serves nothing (a split learner's training process): one
  inter-op thread (``TRAINING_INTER_OP_THREADS``), the intra-op pool TensorFlow's default; so
  do the raw step and every other side measured here.
* **default pools**: the livefit (1-sample chunks) and raw-step measurements in a process of
  their own with TensorFlow's default pools (one inter-op thread per core), as every side ran
  before the training process took one inter-op thread.
* **raw step**: a ``tf.function`` of forward pass, gradient and ``optimizer.apply`` written here,
  fed pre-built tensors of exactly the batch size: what TensorFlow itself allows.
* **per-message**: the classic Keras-over-MQTT loop, ``model.train_on_batch`` on each sample.
* **training process**: the livefit measurement (1-sample chunks) in a process of its own set
  up as ``livefit serve``'s training process is by default on this machine (a split learner):
  pinned to the CPUs ``processes.training_cores = "auto"`` leaves it beside the default serving
  processes, TensorFlow's intra-op pool sized to them and one inter-op thread; its own raw step
  measured in the same process. What users of ``livefit serve`` get here, where the livefit
  side above trains on every core.
* **step alone**: the trainer's compiled step (``TrainStep``) called back to back on batches
  of the batch size with nothing between the calls, each call waiting for its scores, in this
  process and in the training process: what the step's own promises cost (each sample scored
  before the update and its scores read back, the rollback copy and checks, the averaged
  weights), without the trainer's bookkeeping around it. No trainer that runs one batch after
  the other can be faster; the pipelined one can, as it never waits for a step with nothing
  queued behind it.
* **pipelined step alone**: the same step, dispatched the way the pipelined trainer dispatches
  it (TensorFlow's asynchronous executor, the next batch's step started before the previous
  one's scores are read), with nothing else between the calls: what the pipelined trainer would
  reach if its bookkeeping cost nothing. Beside it, the **trainer thread's CPU per batch**: the
  CPU time of the livefit side's trainer thread (1-sample chunks) over its batches, bookkeeping
  and dispatch included: the Python work the step has to hide.
* **one intra-op thread**: the livefit (1-sample chunks) and raw-step measurements in a process
  of their own sized as this one but with one intra-op thread, so that the trainer's thread has
  a core of its own beside TensorFlow's; its livefit figure beside this process's raw step (the
  one the target is against) and its own. Not livefit's default: on a wide model it halves the
  step (docs/benchmarks/trainer.md).
* **before #29**: the same ``Trainer`` measurement (1-sample chunks) and raw step on the code as
  it was before issue #29 (commit 409e868, ``BEFORE_29``, unpacked from this repository's
  history into the work directory), in a process of its own each round: its ratio to its own
  raw step stands beside livefit's. Skipped, with a note, where the history is not there (a
  shallow clone).

Every figure is samples/s but the trainer thread's CPU (us a batch); each round runs every side
once (order rotated), ratios pair the sides of one round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import (
    REPO,
    Benchmark,
    BenchResult,
    Context,
    Row,
    Sizes,
    Spread,
    paired_ratios,
)
from bench.models import MLP, ModelSpec
from bench.procs import QUIET_ENV
from bench.trees import code_at

BEFORE_29 = "409e868"  # main before issue #29's first merge (the trainer as it was)
NO_AVERAGING = {"weight_average": 0.0}  # the livefit side without issue #30's averaging
NO_PIPELINE = {"pipeline": "off"}  # the livefit side one batch after the other
NO_EXPERTS = {"experts": {"enabled": False}}  # the livefit side without issue #47's experts
BEFORE_CHUNK = 1  # the before side is measured with single-sample chunks only

CHUNKS = (1, 100)
SIDES = {
    "livefit": "`Trainer` + `SampleQueue` (default settings: prequential scoring, metrics, "
    'a snapshot every 0.15 s: `weights.serve_interval_s`; `train.pipeline = "auto"`, on in '
    "this process), `train.max_batch_size` = the batch size, `max_wait_ms` = 0",
    "raw step": "`tf.function` (fixed input signature) of forward, `GradientTape` and "
    "`optimizer.apply` on pre-built tensors of the batch size: the hardware limit",
    "per-message": "`model.train_on_batch(x[i:i+1], y[i:i+1])` per sample (compiled Keras model)",
    "livefit, no pipeline": 'the livefit side with `train.pipeline = "off"`: one batch '
    'after the other, as before the pipelined trainer (in this process `"auto"` turns it '
    "on: 2 CPUs, no serving), chunks of 1",
    "livefit, no averaging": "the livefit side with `train.weight_average = 0` (issue #30's "
    "weight averaging off: no averaged weights kept or scored), chunks of 1",
    "livefit, no experts": "the livefit side with `experts.enabled = false` (issue #47's linear "
    "expert and mixture off: the network alone), chunks of 1",
    "training process": "the livefit side (chunks of 1) in its own process pinned and sized as "
    "`livefit serve`'s training process is by default here (`processes.training_cores = "
    '"auto"` beside the default serving processes; intra-op threads = its cores, one inter-op '
    "thread), beside a raw step in that process",
    "step alone": "the trainer's compiled step (`TrainStep`, default settings) called back to "
    "back on batches of the batch size, nothing between calls, each waiting for its scores: the "
    "step's own promises (scores read before the update, rollback copy and checks, averaged "
    "weights) without the trainer's bookkeeping; the ceiling of a trainer that runs one batch "
    "after the other (the pipelined one is not one). Measured in the benchmark's process and in "
    "the training process",
    "default pools": "the livefit (chunks of 1) and raw-step measurements in a process of their "
    "own with TensorFlow's default thread pools (one inter-op thread per core), as every side "
    "ran before livefit's training process took one inter-op thread",
    "trainer thread CPU per batch": "CPU time of the livefit side's trainer thread (chunks of "
    "1) over its batches, in us: bookkeeping and dispatch, the Python the step must hide; "
    "beside it as a share of the raw step's time for a batch",
    "pipelined step alone": "the trainer's compiled step dispatched as the pipelined trainer "
    "dispatches it (asynchronous executor, the next step started before the previous one's "
    "scores are read), nothing else between the calls: the pipelined trainer's ceiling if its "
    "bookkeeping cost nothing",
    "one intra-op thread": "the livefit (chunks of 1) and raw-step measurements in a process of "
    "their own sized as this one but with one intra-op thread (a core left to the trainer's "
    "thread); its livefit beside this process's raw step and beside its own",
    "before #29": f"the livefit and raw-step measurements on the code before issue #29 (commit "
    f"{BEFORE_29}), in a process of their own each round, chunks of {BEFORE_CHUNK}",
}


def run(ctx: Context) -> BenchResult:
    import tensorflow as tf

    from livefit.server.runtime.training_process import TRAINING_INTER_OP_THREADS

    pools = _pools_like_training_process(tf)
    spec = MLP
    sizes = ctx.sizes["batch_sizes"]
    rounds = ctx.sizes["rounds"]
    seconds = ctx.sizes["seconds"]
    result = _result(spec, rounds, seconds)
    result.notes.append(
        "Targets apply at batch sizes 256 (livefit's default) and 1024. At 32 no trainer can "
        "reach 100x per-message: the raw step itself is about 55x `train_on_batch` per sample."
    )
    if ctx.quick:
        result.notes.append(
            "Quick run: the default-pools and one-intra-op-thread sides were skipped (the "
            "training process's measurement under other pools)."
        )
    x_all, y_all = training_data(spec, n=200_000)
    raw_rates: dict[int, list[float]] = {bs: [] for bs in sizes}
    livefit_rates: dict[tuple[int, int], list[float]] = {
        (bs, c): [] for bs in sizes for c in CHUNKS
    }
    per_message: list[float] = []
    no_averaging: dict[int, list[float]] = {bs: [] for bs in sizes}
    no_pipeline: dict[int, list[float]] = {bs: [] for bs in sizes}
    no_experts: dict[int, list[float]] = {bs: [] for bs in sizes}
    before_tree = code_at(BEFORE_29, ctx.workdir / "before-29")
    if before_tree is None:
        result.notes.append(
            f"The before-#29 side was skipped: commit {BEFORE_29} is not in this clone's history."
        )
    before: dict[int, list[tuple[float, float]]] = {bs: [] for bs in sizes}  # (livefit, raw)
    # (livefit, raw, step alone)
    process: dict[int, list[tuple[float, float, float | None]]] = {bs: [] for bs in sizes}
    alone: dict[int, list[float]] = {bs: [] for bs in sizes}
    piped_alone: dict[int, list[float]] = {bs: [] for bs in sizes}
    thread_cpu: dict[int, list[float]] = {bs: [] for bs in sizes}  # us per batch, chunks of 1
    result.settings["tf_threads"] = pools
    defaults: dict[int, list[tuple[float, float, float | None]]] = {bs: [] for bs in sizes}
    one_intra: dict[int, list[tuple[float, float, float | None]]] = {bs: [] for bs in sizes}
    cpus = _training_process_cpus()
    result.settings["training process CPUs"] = (
        "every CPU (nothing to leave out): TensorFlow's defaults" if cpus is None
        else f"{cpus} of {sorted(os.sched_getaffinity(0))}, intra-op threads {len(cpus)}"
    )  # fmt: skip
    for r in range(rounds):
        ctx.step(f"trainer round {r + 1}/{rounds}: per-message train_on_batch")
        per_message.append(_per_message(spec, x_all, y_all, seconds))
        if before_tree is not None:
            for bs, pair in _process_rates(before_tree, sizes, seconds, None, BEFORE_CHUNK).items():
                before[bs].append(pair[:2])
                ctx.step(
                    f"  batch {bs:>4} before #29: livefit {pair[0]:>9,.0f}/s  "
                    f"raw {pair[1]:>9,.0f}/s  ({pair[0] / pair[1]:.3f}x)"
                )
        # The same child-process measurement as the training process's below, under other
        # pools: a quick run, which checks the harness, takes that path once.
        for bs, pair in ({} if ctx.quick else _process_rates(REPO, sizes, seconds, None)).items():
            defaults[bs].append(pair)
            ctx.step(
                f"  batch {bs:>4} TensorFlow's default pools: livefit {pair[0]:>9,.0f}/s  "
                f"raw {pair[1]:>9,.0f}/s  ({pair[0] / pair[1]:.3f}x)"
            )
        one_thread: dict[int, tuple[float, float, float | None]] = {}
        if not ctx.quick:
            one_thread = _process_rates(
                REPO, sizes, seconds, None, inter=TRAINING_INTER_OP_THREADS, intra=1
            )
        for bs, pair in one_thread.items():
            one_intra[bs].append(pair)
            ctx.step(
                f"  batch {bs:>4} one intra-op thread: livefit {pair[0]:>9,.0f}/s  "
                f"raw {pair[1]:>9,.0f}/s  ({pair[0] / pair[1]:.3f}x)"
            )
        for bs, pair in _process_rates(
            REPO, sizes, seconds, cpus, inter=TRAINING_INTER_OP_THREADS
        ).items():
            process[bs].append(pair)
            ctx.step(
                f"  batch {bs:>4} training process: livefit {pair[0]:>9,.0f}/s  "
                f"raw {pair[1]:>9,.0f}/s  ({pair[0] / pair[1]:.3f}x)  "
                f"step alone {pair[2] or 0:>9,.0f}/s"
            )
        for bs in _rotate(sizes, r):
            raw = _raw_step(tf, spec, x_all, y_all, bs, seconds)
            raw_rates[bs].append(raw)
            n = _count_for(raw, bs, seconds, len(x_all))
            plain, _ = trainer_rate(spec, x_all[:n], y_all[:n], bs, 1, train=NO_AVERAGING)
            no_averaging[bs].append(plain)
            one_by_one, _ = trainer_rate(spec, x_all[:n], y_all[:n], bs, 1, train=NO_PIPELINE)
            no_pipeline[bs].append(one_by_one)
            network, _ = trainer_rate(spec, x_all[:n], y_all[:n], bs, 1, model=NO_EXPERTS)
            no_experts[bs].append(network)
            alone[bs].append(step_rate(spec, x_all, y_all, bs, seconds))
            piped_alone[bs].append(step_rate(spec, x_all, y_all, bs, seconds, pipelined=True))
            for chunk in _rotate(list(CHUNKS), r):
                rate, checks = trainer_rate(spec, x_all[:n], y_all[:n], bs, chunk)
                livefit_rates[(bs, chunk)].append(rate)
                if chunk == 1:
                    thread_cpu[bs].append(checks["thread_cpu_s"] / (n / bs) * 1e6)
                result.check(
                    f"livefit trained every sample (batch {bs}, chunk {chunk})",
                    checks["samples_seen"] == n,
                    f"{checks['samples_seen']} of {n}",
                )
                ctx.step(
                    f"  batch {bs:>4} chunk {chunk:>3}: livefit {rate:>9,.0f}/s  "
                    f"raw {raw:>9,.0f}/s  per-message {per_message[-1]:,.0f}/s"
                )
    result.merge_checks()
    for bs in sizes:
        for chunk in CHUNKS:
            pairs = before[bs] if chunk == BEFORE_CHUNK else []
            plain = no_averaging[bs] if chunk == 1 else []
            own = process[bs] if chunk == 1 else []
            result.rows.append(
                _row(
                    bs,
                    chunk,
                    livefit_rates[(bs, chunk)],
                    raw_rates[bs],
                    per_message,
                    pairs,
                    plain,
                    own,
                    alone[bs] if chunk == 1 else [],
                    no_pipeline[bs] if chunk == 1 else [],
                    piped_alone[bs] if chunk == 1 else [],
                    thread_cpu[bs] if chunk == 1 else [],
                    defaults[bs] if chunk == 1 else [],
                    one_intra[bs] if chunk == 1 else [],
                    no_experts[bs] if chunk == 1 else [],
                )
            )
    return result


def _pools_like_training_process(tf: Any) -> str:
    """Size this process's TensorFlow pools as livefit sizes those of a process that trains
    and serves nothing (a split learner's training process: one inter-op thread), before its
    first op; what was set, in words. The process stays so, which is why ``python -m bench``
    runs this benchmark in a process of its own (``bench.cli.ISOLATED``)."""
    from livefit.server.runtime.training_process import TRAINING_INTER_OP_THREADS

    try:
        tf.config.threading.set_inter_op_parallelism_threads(TRAINING_INTER_OP_THREADS)
    except RuntimeError:  # TensorFlow already ran in this process
        return (
            "TensorFlow's defaults: its pools already ran in this process, so the training "
            "process's one inter-op thread could not be set"
        )
    return (
        f"as livefit's training process sizes them: {TRAINING_INTER_OP_THREADS} inter-op "
        "thread (it serves nothing), intra-op TensorFlow's default (every core); the side "
        '"default pools" runs TensorFlow\'s defaults in a process of its own'
    )


def _training_process_cpus() -> list[int] | None:
    """The CPUs ``livefit serve``'s training process runs on here by default (None: every
    one), as ``server/runtime/training_process.py`` computes them."""
    from livefit.server.config.machine import default_serving_processes, training_cpus

    return training_cpus("auto", default_serving_processes())


_PROCESS_SCRIPT = """
import json, os, sys
sys.path.insert(0, ".")
cpus, sizes, seconds, chunk, inter, intra = json.loads(sys.argv[1])
if cpus is not None:  # before TensorFlow starts a thread: every one inherits the mask
    os.sched_setaffinity(0, cpus)
import tensorflow as tf
if intra or cpus is not None:
    tf.config.threading.set_intra_op_parallelism_threads(intra or len(cpus))
if inter:
    tf.config.threading.set_inter_op_parallelism_threads(inter)
from bench.models import MLP
from bench.trainer import _count_for, _raw_step, trainer_rate, training_data
try:
    from bench.trainer import step_rate
except ImportError:  # code from before the step-alone side
    step_rate = None
x, y = training_data(MLP, n=200_000)
out = {}
for bs in sizes:
    raw = _raw_step(tf, MLP, x, y, bs, seconds)
    n = _count_for(raw, bs, seconds, len(x))
    alone = step_rate(MLP, x, y, bs, seconds) if step_rate is not None else None
    out[bs] = (trainer_rate(MLP, x[:n], y[:n], bs, chunk)[0], raw, alone)
print(json.dumps(out))
"""


def _process_rates(
    tree: Path, sizes: list[int], seconds: float, cpus: list[int] | None, chunk: int = 1,
    inter: int = 0, intra: int = 0,
) -> dict[int, tuple[float, float, float | None]]:  # fmt: skip
    """{batch size: (trainer samples/s, raw step samples/s, step alone samples/s or None where
    the code has no ``step_rate``)} of the code in ``tree``, measured
    in a fresh process the way this benchmark measures in its own: pinned to ``cpus`` with
    its intra-op pool sized to them (the training process), or with TensorFlow's defaults on
    every CPU (None: the before-#29 side, whose tree has the same helpers); ``inter``, ``intra``:
    its inter-op and intra-op pools (0: TensorFlow's default; the intra-op pool sized to
    ``cpus`` where given)."""
    env = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _PROCESS_SCRIPT,
         json.dumps([cpus, sizes, seconds, chunk, inter, intra])],
        cwd=tree, env=env, capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    line = done.stdout.strip().splitlines()[-1]
    return {
        int(bs): (float(a), float(b), None if c is None else float(c))
        for bs, (a, b, c) in json.loads(line).items()
    }


def _result(spec: ModelSpec, rounds: int, seconds: float) -> BenchResult:
    """The result, before any measurement: sides and settings."""
    return BenchResult(
        name="trainer",
        title="Trainer throughput",
        what=__doc__.split("\n", 2)[2].strip(),
        sides=SIDES,
        settings={
            "model": spec.describe(),
            "optimizer": f"{spec.optimizer} lr {spec.learning_rate}",
            "loss": spec.loss,
            "rounds": rounds,
            "seconds per measurement": seconds,
            "tf_threads": "TensorFlow defaults",
        },
    )


def _row(
    bs: int, chunk: int, livefit: list[float], raw: list[float], per_message: list[float],
    before: list[tuple[float, float]], no_averaging: list[float],
    process: list[tuple[float, float, float | None]] | None = None,
    alone: list[float] | None = None,
    no_pipeline: list[float] | None = None,
    piped_alone: list[float] | None = None,
    thread_cpu: list[float] | None = None,
    defaults: list[tuple[float, float, float | None]] | None = None,
    one_intra: list[tuple[float, float, float | None]] | None = None,
    no_experts: list[float] | None = None,
) -> Row:  # fmt: skip
    row = Row(case={"batch size": bs, "samples per chunk": chunk})
    row.figures["livefit samples/s"] = Spread.of(livefit, "samples/s")
    row.figures["raw step samples/s"] = Spread.of(raw, "samples/s")
    row.figures["per-message samples/s"] = Spread.of(per_message, "samples/s")
    row.ratios["livefit ÷ raw step"] = paired_ratios(livefit, raw)
    row.ratios["livefit ÷ per-message"] = paired_ratios(livefit, per_message)
    for side, rates in (("no averaging", no_averaging), ("no pipeline", no_pipeline),
                        ("step alone", alone), ("pipelined step alone", piped_alone)):  # fmt: skip
        if rates:  # each beside the raw step, paired by round
            row.figures[f"{side} samples/s"] = Spread.of(rates, "samples/s")
            row.ratios[f"{side} ÷ raw step"] = paired_ratios(rates, raw)
    if defaults:
        default_livefit, default_raw = [d[0] for d in defaults], [d[1] for d in defaults]
        row.figures["default pools: livefit samples/s"] = Spread.of(default_livefit, "samples/s")
        row.figures["default pools: raw step samples/s"] = Spread.of(default_raw, "samples/s")
        row.ratios["default pools: livefit ÷ its raw step"] = paired_ratios(
            default_livefit, default_raw
        )
        row.ratios["raw step ÷ default pools' raw step"] = paired_ratios(raw, default_raw)
    if one_intra:
        intra_livefit, intra_raw = [d[0] for d in one_intra], [d[1] for d in one_intra]
        row.figures["one intra-op thread: livefit samples/s"] = Spread.of(
            intra_livefit, "samples/s"
        )
        row.figures["one intra-op thread: raw step samples/s"] = Spread.of(intra_raw, "samples/s")
        row.ratios["one intra-op thread: livefit ÷ raw step"] = paired_ratios(intra_livefit, raw)
        row.ratios["one intra-op thread: livefit ÷ its raw step"] = paired_ratios(
            intra_livefit, intra_raw
        )
    if thread_cpu:
        row.figures["trainer thread CPU per batch"] = Spread.of(thread_cpu, "us")
        row.ratios["trainer thread CPU ÷ raw step time"] = paired_ratios(
            thread_cpu, [bs / r * 1e6 for r in raw]
        )
    if no_pipeline:
        row.ratios["livefit ÷ no pipeline"] = paired_ratios(livefit, no_pipeline)
    if no_experts:
        row.figures["no experts samples/s"] = Spread.of(no_experts, "samples/s")
        row.ratios["livefit ÷ no experts"] = paired_ratios(livefit, no_experts)
        if bs >= 256:  # issue #47: experts on by default only at this cost
            row.target("livefit ÷ no experts", ">=", 0.85, "≥ 0.85x without experts")
    if process:
        row.figures["training process samples/s"] = Spread.of([p[0] for p in process], "samples/s")
        row.figures["its raw step samples/s"] = Spread.of([p[1] for p in process], "samples/s")
        row.ratios["training process ÷ its raw step"] = paired_ratios(
            [p[0] for p in process], [p[1] for p in process]
        )
        row.ratios["training process ÷ raw step"] = paired_ratios([p[0] for p in process], raw)
        steps = [p[2] for p in process if p[2] is not None]
        if len(steps) == len(process):
            row.figures["its step alone samples/s"] = Spread.of(steps, "samples/s")
            row.ratios["its step alone ÷ its raw step"] = paired_ratios(
                steps, [p[1] for p in process]
            )
    if before:
        row.figures["before #29 samples/s"] = Spread.of([b[0] for b in before], "samples/s")
        row.ratios["before #29 ÷ its raw step"] = paired_ratios(
            [b[0] for b in before], [b[1] for b in before]
        )
    if bs >= 256:  # at 32 even the raw step is only ~55x per-message: no target there
        row.target("livefit ÷ raw step", ">=", 0.8, "≥ 0.8x raw step")
        row.target("livefit ÷ per-message", ">=", 100, "≥ 100x per-message")
    return row


def training_data(spec: ModelSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    from livefit.clients.synthetic import LinearStream

    stream = LinearStream(spec.input_shape[0], spec.output_shape[0], seed=3)
    return stream.sample(n)


def _rotate(items: list[Any], by: int) -> list[Any]:
    k = by % len(items)
    return items[k:] + items[:k]


def _count_for(rate: float, bs: int, seconds: float, limit: int) -> int:
    """A sample count that takes the raw step about ``seconds``, in whole batches."""
    batches = max(8, int(rate * seconds / bs))
    return min(limit // bs, batches) * bs


def _raw_step(
    tf: Any, spec: ModelSpec, x: np.ndarray, y: np.ndarray, bs: int, seconds: float
) -> float:
    import keras

    model = spec.build(compiled=True)
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.get(spec.loss)
    signature = [
        tf.TensorSpec([bs, *spec.input_shape], tf.float32),
        tf.TensorSpec([bs, *spec.output_shape], tf.float32),
    ]

    @tf.function(input_signature=signature)
    def step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(yb, model(xb, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    batches = min(64, len(x) // bs)
    tensors = [
        (tf.constant(x[i * bs : (i + 1) * bs]), tf.constant(y[i * bs : (i + 1) * bs]))
        for i in range(batches)
    ]
    for xb, yb in tensors[:3]:
        step(xb, yb).numpy()
    done, started = 0, time.perf_counter()
    loss = None
    while time.perf_counter() - started < seconds:
        for xb, yb in tensors:
            loss = step(xb, yb)
            done += bs
    if loss is not None:
        loss.numpy()
    return done / (time.perf_counter() - started)


def _per_message(spec: ModelSpec, x: np.ndarray, y: np.ndarray, seconds: float) -> float:
    model = spec.build(compiled=True)
    for i in range(10):  # tracing and the first calls are not what a long loop pays
        model.train_on_batch(x[i : i + 1], y[i : i + 1])
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.train_on_batch(x[done : done + 1], y[done : done + 1])
        done += 1
    return done / (time.perf_counter() - started)


def _trainer(spec: ModelSpec, bs: int, capacity: int, device: Any = None,
             train: dict[str, Any] | None = None,
             model: dict[str, Any] | None = None) -> tuple[Any, Any]:  # fmt: skip
    """A warmed-up ``Trainer`` of ``spec`` at batch size ``bs`` (default settings beyond the
    batch size and queue, and ``model``'s top-level ones), and its queue."""
    from prometheus_client import CollectorRegistry

    from livefit.server.base.metrics import Metrics
    from livefit.server.config.model import ModelSettings
    from livefit.server.ingest.sample_queue import SampleQueue
    from livefit.server.train.modeling import resolve_device
    from livefit.server.train.trainer import Trainer
    from livefit.server.wire.snapshot import SnapshotSlot

    settings = ModelSettings.model_validate(
        {
            "builder": spec.builder,
            "builder_options": spec.options,
            "input_shape": list(spec.input_shape),
            "output_shape": list(spec.output_shape),
            "loss": spec.loss,
            "optimizer": spec.optimizer,
            "learning_rate": spec.learning_rate,
            "seed": spec.seed,
            "scaling": spec.scaling,
            "train": {"max_batch_size": bs, "queue_capacity": capacity, **(train or {})},
            **(model or {}),
        }
    )
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("bench")
    queue = SampleQueue(settings.train.queue_capacity)
    device = resolve_device("auto") if device is None else device
    trainer = Trainer("bench", settings, queue, SnapshotSlot(), metrics, device)
    trainer.warm_up()
    return trainer, queue


def trainer_rate(
    spec: ModelSpec, x: np.ndarray, y: np.ndarray, bs: int, chunk: int, device: Any = None,
    train: dict[str, Any] | None = None, model: dict[str, Any] | None = None,
) -> tuple[float, dict[str, int]]:  # fmt: skip
    """Samples/s of a real ``Trainer`` (on ``device``: a name or a ``Placement``; default
    ``auto``) through every sample of ``x``, queued in chunks of ``chunk``; ``train``: more
    ``[train]`` settings than the batch size and queue; ``model``: top-level settings."""
    from livefit.server.wire.samples import SampleChunk

    n = len(x)
    trainer, queue = _trainer(spec, bs, n + 1, device, train, model)
    ones = np.ones(bs, dtype=np.float32)
    for _ in range(2):  # the first calls of a traced function are not what a stream pays
        trainer.step(x[:bs], y[:bs], ones)
    now = time.time()
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        w = np.ones(end - start, dtype=np.float32)
        queue.put(SampleChunk(x[start:end], y[start:end], w, published_at=now, received_at=now))
    started = time.perf_counter()
    trainer.start()
    trainer.stop(timeout=600)
    elapsed = time.perf_counter() - started
    return n / elapsed, {"samples_seen": trainer.samples_seen, "thread_cpu_s": trainer.thread_cpu_s}


def step_rate(
    spec: ModelSpec, x: np.ndarray, y: np.ndarray, bs: int, seconds: float, pipelined: bool = False
) -> float:
    """Samples/s of the trainer's compiled step alone (``TrainStep``, default settings), called
    back to back on batches of ``bs`` with nothing between the calls, each waiting for its
    scores: what the step itself costs (scores before the update, rollback copy and checks,
    averaged weights) before the trainer's bookkeeping (scaling statistics, drift, replay,
    prequential windows, metrics). The ceiling of a trainer that runs one batch after the
    other. With ``pipelined``: dispatched as the pipelined trainer dispatches it (its thread's
    executor asynchronous, the next step started before the previous one's scores are read),
    nothing else between: that trainer's ceiling if its bookkeeping cost nothing."""
    trainer, _ = _trainer(spec, bs, 2)
    step, policy = trainer.step, trainer.policy
    ones = np.ones(bs, dtype=np.float32)
    batches = [(x[i * bs : (i + 1) * bs], y[i * bs : (i + 1) * bs]) for i in range(len(x) // bs)]
    # numpy statistics, as the trainer passes them (without, the step reads its variables)
    stats = [
        None if layer is None else (np.asarray(layer.mean), np.asarray(layer.std))
        for layer in (policy.scaling.layer, policy.scaling.target_layer)
    ]
    for xb, yb in batches[:3]:
        step(xb, yb, ones, *stats)
    if pipelined:
        return _pipelined_rate(step, batches[:64], ones, stats, bs, seconds)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for xb, yb in batches[:64]:
            step(xb, yb, ones, *stats)
            done += bs
    return done / (time.perf_counter() - started)


def _pipelined_rate(
    step: Any, batches: list[tuple[np.ndarray, np.ndarray]], ones: np.ndarray,
    stats: list[Any], bs: int, seconds: float,
) -> float:  # fmt: skip
    """``step_rate``'s pipelined side: one step always queued behind the one whose scores
    are read, in an asynchronous executor (as ``step_pipeline.asynchronous_executor`` sets
    it up)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.execution_mode = context.ASYNC
    try:
        done, started = 0, time.perf_counter()
        pending = None
        while time.perf_counter() - started < seconds:
            for xb, yb in batches:
                following = step.dispatch(xb, yb, ones, *stats)
                if pending is not None:
                    step.collect(pending)
                    done += bs
                pending = following
        if pending is not None:
            step.collect(pending)
            done += bs
        return done / (time.perf_counter() - started)
    finally:
        try:
            ctx.executor.wait()
        except Exception:  # a step's error, raised above already: the thread goes on synchronous
            ctx.executor.clear_error()
        ctx.execution_mode = context.SYNC


BENCHMARK = Benchmark(
    name="trainer",
    summary="livefit's trainer vs the raw compiled step and per-message train_on_batch",
    columns=(
        "livefit samples/s",
        "raw step samples/s",
        "livefit ÷ raw step",
        "livefit ÷ no experts",
        "livefit ÷ per-message",
    ),
    run=run,
    sizes=Sizes(
        quick={"batch_sizes": [256], "rounds": 1, "seconds": 0.15},  # 256: rows with targets
        full={"batch_sizes": [32, 256, 1024], "rounds": 3, "seconds": 1.0},
    ),
    # the prose says where the trainer's time went and why its defaults are what they are
    explained_always=True,
)
