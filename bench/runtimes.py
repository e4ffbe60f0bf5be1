"""Benchmark 2b, serving runtimes: one model call as the batcher makes it, per ``serve.runtime``.

In one process, on the benchmark models (same builder, seed and scaling as the fleet's), a
``ServingModel`` per runtime (``keras``: the traced graph of before; ``xla``; ``numpy`` where
the model is a Dense chain) holding the same snapshot; each round times ``predict`` of 1 row
(a lone request) and of 64 rows (a full batch) on every runtime, the order rotated, and takes
the median of each run's calls. Ratios pair the runs of one round: the keras runtime's time
over this runtime's (above 1: faster). Start-up is construction plus ``warm_up`` (one trace or
compilation per padded batch size); memory is the process's resident set growth while the
runtime was built, a rough figure (allocator reuse hides some of it).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.models import LSTM, MLP, ModelSpec

RUNTIMES = ("keras", "xla", "numpy")
ROWS = (1, 64)
TARGET = 1.5  # the runtime "auto" takes over keras, at 1 row: at least this much faster
SIDES = {
    "keras": "the Keras model traced once by `tf.function`, called through its concrete "
    "function's flat entry, padded to powers of two (the runtime of before)",
    "xla": "the same trace with `jit_compile=True`: XLA compiles it once per padded batch size",
    "numpy": "a NumPy forward pass generated from the Dense chain (scaling, Dense, activations), "
    "the same float32 operations, reading the snapshot's arrays; no padding",
}


def run(ctx: Context) -> BenchResult:
    result = BenchResult(
        name="runtimes",
        title="Serving runtimes: one model call",
        what=__doc__.split("\n", 2)[2].strip(),
        sides=SIDES,
        settings={
            "models": "; ".join(m.describe() for m in ctx.sizes["models"]),
            "calls": f"`ServingModel.predict` of 1 and 64 rows for {ctx.sizes['seconds']} s",
            "rounds": ctx.sizes["rounds"],
            "batch sizes": "1, 2, 4, ..., 64 (livefit's default)",
        },
    )
    for spec in ctx.sizes["models"]:
        _measure_model(ctx, spec, result)
    return result


def _measure_model(ctx: Context, spec: ModelSpec, result: BenchResult) -> None:
    servings, startup, memory = _build_all(ctx, spec, result)
    times: dict[tuple[str, int], list[float]] = {(r, n): [] for r in servings for n in ROWS}
    names = list(servings)
    auto = "numpy" if "numpy" in servings else "keras"  # what serve.runtime = "auto" takes
    for r in range(ctx.sizes["rounds"]):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            for n in ROWS:
                times[name, n].append(_median_call(servings[name], spec, n, ctx.sizes["seconds"]))
        ctx.step(
            f"runtimes {spec.name} round {r + 1}: "
            + ", ".join(f"{k[0]}/{k[1]} {v[-1] * 1e6:.0f} us" for k, v in times.items())
        )
    for n in ROWS:
        for name in names:
            row = Row(case={"model": spec.name, "rows": n, "runtime": servings[name].runtime.name})
            row.figures["us per call"] = Spread.of([t * 1e6 for t in times[name, n]], "us")
            row.figures["start-up s"] = Spread.of([startup[name]], "s")
            row.figures["memory MB"] = Spread.of([memory[name]], "MB")
            if name != "keras":
                row.ratios["keras ÷ this (time)"] = paired_ratios(times["keras", n], times[name, n])
                if n == 1 and name == auto:
                    row.target("keras ÷ this (time)", ">=", TARGET, f"auto's ≥ {TARGET:g}x keras")
            result.rows.append(row)


def _build_all(ctx: Context, spec: ModelSpec, result: BenchResult) -> tuple[dict, dict, dict]:
    """A warmed-up ``ServingModel`` per runtime that takes ``spec``, all on one snapshot; each
    one's outputs checked against Keras."""
    from livefit.server.serve.serving import ServingModel
    from livefit.server.wire.snapshot import Snapshot

    reference = spec.build()
    rng = np.random.default_rng(11)
    weights = tuple(  # weights away from the initial ones, scaling statistics included
        (rng.normal(scale=0.3, size=w.shape) + (1.0 if np.all(w == 1) else 0.0)).astype(np.float32)
        for w in reference.get_weights()
    )
    reference.set_weights(list(weights))
    snapshot = Snapshot(spec.name, 1, weights, 0.0, 0)
    rows = spec.rows(64)
    expected = np.asarray(reference(rows, training=False))
    servings: dict[str, Any] = {}
    startup: dict[str, float] = {}
    memory: dict[str, float] = {}
    for name in RUNTIMES:
        before = _rss_mb()
        started = time.perf_counter()
        serving = ServingModel(
            spec.name, spec.build(), list(spec.input_shape), _sizes(), lambda: snapshot,
            "/CPU:0", runtime=name,
        )  # fmt: skip
        serving.warm_up()
        startup[name] = time.perf_counter() - started
        memory[name] = _rss_mb() - before
        if serving.runtime.name != name:
            result.notes.append(f"{spec.name}: the {name} runtime does not take this model")
            continue
        got, _ = serving.predict(rows)
        error = float(np.abs(got - expected).max())
        result.check(
            f"{spec.name}: {name} answers what Keras answers (64 rows)",
            bool(np.allclose(got, expected, rtol=1e-4, atol=1e-5)),
            f"max |difference| {error:.2e}",
        )
        servings[name] = serving
        ctx.step(f"runtimes {spec.name}: {name} built in {startup[name]:.2f} s")
    return servings, startup, memory


def _sizes() -> list[int]:
    from livefit.server.config.model_tables import ServeSettings

    return ServeSettings().batch_sizes()


def _median_call(serving: Any, spec: ModelSpec, n: int, seconds: float) -> float:
    rows = spec.rows(n, seed=n)
    serving.predict(rows)
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        serving.predict(rows)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


BENCHMARK = Benchmark(
    name="runtimes",
    summary="one serving model call per serve.runtime: keras (before), xla, numpy",
    columns=(
        "us per call",
        "keras ÷ this (time)",
    ),
    run=run,
    sizes=Sizes(
        quick={"models": [MLP], "rounds": 1, "seconds": 0.1},
        full={"models": [MLP, LSTM], "rounds": 5, "seconds": 0.5},
    ),
    explained_always=True,  # its prose says why serve.runtime's default is what it is
)
