"""Benchmark, batch timeout: livefit at ``serve.batch_timeout_ms`` 0, 1 and 5 ms and "auto".

One ``livefit serve`` holds the serving benchmark's mlp five times, each copy (same seed, same
weights) its own model under one setting (``bench/fleet.py``: ``mlp_t0``, ``mlp_t1``,
``mlp_t5``, ``mlp_tauto``, and ``mlp_t0b``, a second copy of 0 ms served last: an A/A
control), so the settings run side by side in one process. The load is the serving
benchmark's: N keep-alive connections, closed loop, one-row TF Serving body, a fixed duration;
each round runs every setting at every client count, the order rotated, and a ratio pairs the
runs of one round. After each run the timeout gauge (``livefit_predict_batch_timeout_seconds``)
is read: for "auto", the timeout it chose for the latest batch. "auto" would be the default only
if it is never worse than 0 ms beyond noise, which the A/A pair measures.
"""

from __future__ import annotations

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.load import LoadResult, run_load
from bench.models import MLP
from bench.serving import rotate
from livefit.clients.metrics import MetricsReader
from livefit.server.config.model_tables import ServeSettings

# "0b": a second copy of 0, served by the last model of the learner: the A/A pair shows how
# far two identical settings differ here (noise, and the model's place in the process)
TIMEOUTS = ("0", "1", "5", "auto", "0b")
TIMEOUT_GAUGE = "livefit_predict_batch_timeout_seconds"
AUTO_GOAL = 0.9  # auto's req/s over 0 ms's, at every client count: "no worse beyond noise"


def run(ctx: Context) -> BenchResult:
    keys = list(ctx.sizes["keys"])
    clients = ctx.sizes["clients"]
    rounds = ctx.sizes["rounds"]
    duration = ctx.sizes["duration"]
    bound = ServeSettings().max_batch_timeout_ms
    result = BenchResult(
        name="batching",
        title="Batch timeout: 0, fixed, auto",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={f"livefit, batch_timeout_ms {_label(k)}": _how(k, bound) for k in keys},
        settings={
            "model": MLP.describe(),
            "request": "one row, TF Serving `instances` JSON",
            "clients": clients,
            "seconds per run": duration,
            "rounds": rounds,
            "load client": ctx.load_client,
        },
    )
    runs, chose = _measure(ctx, keys, clients, rounds, duration)
    for n in clients:
        result.rows += [_row(n, key, runs, chose) for key in keys]
    result.extra["runs"] = {k: [r.to_json() for r in v] for k, v in runs.items()}
    result.extra["timeout chosen ms"] = chose
    errors = sum(r.errors for v in runs.values() for r in v)
    result.check("every request answered 200, no socket error", errors == 0, f"{errors} errors")
    return result


def _label(key: str) -> str:
    return "0 (A/A copy)" if key == "0b" else key


def _how(key: str, bound: float) -> str:
    if key == "auto":
        return (
            "chosen per batch from the arrival rate and the model call's fitted cost "
            f"(`AutoTimeout`), at most `max_batch_timeout_ms` = {bound:g}"
        )
    if key == "0":
        return "a batch fires as soon as the model is free (the current default)"
    if key == "0b":
        return "the same as 0, a second copy, last in the learner: the A/A control"
    return f"a batch fires {key} ms after its oldest request arrived, or when full"


def _measure(
    ctx: Context, keys: list[str], clients: list[int], rounds: int, duration: float
) -> tuple[dict[str, list[LoadResult]], dict[str, list[float]]]:
    """Every round runs every setting at every client count, rotated; returns the load runs
    and the timeout gauge read after each (ms), both by ``"<clients>/<key>"``."""
    runs: dict[str, list[LoadResult]] = {}
    chose: dict[str, list[float]] = {}
    body, load_dir = MLP.request_body(), ctx.workdir / "load"
    ctx.step("mlp: starting livefit with one model per batch timeout")
    with ctx.fleet(*(f"mlp_t{k}" for k in keys)) as fleet:
        url = fleet.learner.url
        for key in keys if not ctx.quick else ():  # first calls are not measured
            run_load(ctx.load_client, _url(url, key), body, 16, 1.0, load_dir)
        for r in range(rounds):
            for i, n in enumerate(clients):
                for key in rotate(keys, r * len(clients) + i):
                    load = run_load(ctx.load_client, _url(url, key), body, n, duration, load_dir)
                    gauge = MetricsReader(url).value(TIMEOUT_GAUGE, model=f"mlp_t{key}") * 1e3
                    runs.setdefault(f"{n}/{key}", []).append(load)
                    chose.setdefault(f"{n}/{key}", []).append(gauge)
                    ctx.step(
                        f"round {r + 1}/{rounds} {n:>3} clients timeout {key:>4}: "
                        f"{load.rps:>7,.0f} req/s  p50 {load.p50_ms:7.2f} ms  "
                        f"p99 {load.p99_ms:7.2f} ms  timeout {gauge:.3f} ms"
                    )
    return runs, chose


def _url(base: str, key: str) -> str:
    return f"{base}/v1/models/mlp_t{key}:predict"


def _row(n: int, key: str, runs: dict[str, list[LoadResult]], chose: dict[str, list[float]]) -> Row:
    """One setting at ``n`` clients, with its ratios to 0 ms paired by round."""
    mine, zero = runs[f"{n}/{key}"], runs[f"{n}/0"]
    row = Row(case={"clients": n, "batch_timeout_ms": _label(key)})
    row.figures["req/s"] = Spread.of([r.ok_rps for r in mine], "req/s")
    row.figures["p50 ms"] = Spread.of([r.p50_ms for r in mine], "ms")
    row.figures["p99 ms"] = Spread.of([r.p99_ms for r in mine], "ms")
    row.figures["errors"] = Spread.of([float(r.errors) for r in mine], "")
    row.figures["timeout ms (gauge)"] = Spread.of(chose[f"{n}/{key}"], "ms")
    if key != "0":
        ratio = "this ÷ 0 ms (req/s)"
        row.ratios[ratio] = paired_ratios([r.ok_rps for r in mine], [r.ok_rps for r in zero])
        row.ratios["p50 ÷ 0 ms"] = paired_ratios([r.p50_ms for r in mine], [r.p50_ms for r in zero])
        row.ratios["p99 ÷ 0 ms"] = paired_ratios([r.p99_ms for r in mine], [r.p99_ms for r in zero])
        if key == "auto":
            row.target(ratio, ">=", AUTO_GOAL, f"auto ≥ {AUTO_GOAL:g}x of 0 ms")
    return row


BENCHMARK = Benchmark(
    name="batching",
    summary="serve.batch_timeout_ms 0, 1, 5 ms and auto, side by side at 1, 16, 64 clients",
    columns=(
        "req/s",
        "p99 ms",
        "this ÷ 0 ms (req/s)",
        "p99 ÷ 0 ms",
    ),
    run=run,
    sizes=Sizes(
        # quick: the shared fleet holds these two timeouts
        quick={"keys": ("0", "auto"), "clients": [1, 64], "rounds": 1, "duration": 1.0},
        full={"keys": TIMEOUTS, "clients": [1, 16, 64], "rounds": 5, "duration": 2.0},
    ),
    explained_always=True,
)
