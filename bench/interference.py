"""Benchmark 5, interference: prediction latency while the trainer is saturated, versus idle.

One ``livefit serve`` (default settings) on a mosquitto started here. Each round measures the
same 64-client prediction load twice: with the trainer idle, and while a publisher process
streams 100-sample msgpack messages as fast as it can (started a second before the load, so
the trainer is busy throughout; stopped after, and the backlog drained before the next run).
The order alternates between rounds; the ratio pairs the two runs of a round.
"""

from __future__ import annotations

import time

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.load import LoadResult, run_load
from bench.models import MLP, ModelSpec
from bench.procs import ToolProcess
from livefit.server.processes.local_processes import LivefitProcess

CLIENTS = 64
MODEL = "busy"


def run(ctx: Context) -> BenchResult:
    rounds = ctx.sizes["rounds"]
    duration = ctx.sizes["duration"]
    spec = MLP
    result = _result(spec, rounds, duration)
    work = ctx.workdir
    body = spec.request_body()
    idle: list[LoadResult] = []
    busy: list[LoadResult] = []
    train_rates: list[float] = []
    with ctx.fleet(MODEL) as fleet:
        broker, learner = fleet.broker, fleet.learner
        url = f"{learner.url}/v1/models/{MODEL}:predict"
        run_load(ctx.load_client, url, body, 16, 1.0, work / "load")  # first calls
        for r in range(rounds):
            for phase in ("idle", "saturated") if r % 2 == 0 else ("saturated", "idle"):
                if phase == "idle":
                    idle.append(
                        run_load(ctx.load_client, url, body, CLIENTS, duration, work / "load")
                    )
                    load = idle[-1]
                else:
                    last = r == rounds - 1 and r % 2 == 0
                    load, rate = _saturated(
                        ctx, learner, broker.url, url, body, duration, r, drain=not last
                    )
                    busy.append(load)
                    train_rates.append(rate)
                ctx.step(
                    f"round {r + 1}/{rounds} {phase:>9}: {load.rps:7,.0f} req/s  p50 "
                    f"{load.p50_ms:6.2f} ms  p99 {load.p99_ms:7.2f} ms"
                    + (f"  training {train_rates[-1]:,.0f} samples/s" if phase != "idle" else "")
                )
    row = Row(case={"model": spec.name, "clients": CLIENTS})
    row.figures["idle p99 ms"] = Spread.of([r.p99_ms for r in idle], "ms")
    row.figures["saturated p99 ms"] = Spread.of([r.p99_ms for r in busy], "ms")
    row.figures["idle req/s"] = Spread.of([r.rps for r in idle], "req/s")
    row.figures["saturated req/s"] = Spread.of([r.rps for r in busy], "req/s")
    row.figures["training samples/s"] = Spread.of(train_rates, "samples/s")
    row.ratios["saturated ÷ idle (p99)"] = paired_ratios(
        [r.p99_ms for r in busy], [r.p99_ms for r in idle]
    )
    row.target("saturated ÷ idle (p99)", "<=", 1.5, "p99 ≤ 1.5x idle")
    result.rows.append(row)
    errors = sum(r.errors for r in idle + busy)
    result.check("every answer was 200 with no socket error", errors == 0, f"{errors} errors")
    result.check(
        "the trainer was training during every saturated run",
        all(rate > 0 for rate in train_rates),
        f"{train_rates}",
    )
    result.extra["idle"] = [r.to_json() for r in idle]
    result.extra["saturated"] = [r.to_json() for r in busy]
    return result


def _result(spec: ModelSpec, rounds: int, duration: float) -> BenchResult:
    """The result, before any measurement: sides and settings."""
    return BenchResult(
        name="interference",
        title="Interference: predictions while training",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={
            "idle": "no samples arriving",
            "saturated": "a publisher streaming 100-sample "
            "msgpack messages (QoS 1, window 1000) as fast as it can, for the whole run",
        },
        settings={
            "model": spec.describe(),
            "clients": CLIENTS,
            "seconds per run": duration,
            "rounds": rounds,
            "server": "`livefit serve`, default settings",
        },
    )


def _saturated(
    ctx: Context,
    learner: LivefitProcess,
    broker_url: str,
    url: str,
    body: bytes,
    duration: float,
    r: int,
    drain: bool,
) -> tuple[LoadResult, float]:
    metric = "livefit_train_samples_total"
    args = [
        "--broker",
        broker_url,
        "--topic",
        f"livefit/{MODEL}/samples",
        "--fmt",
        "msgpack",
        "--batch",
        100,
        "--count",
        50_000_000,
        "--duration",
        duration + 30,
    ]
    with ToolProcess("bench.stream_publisher", args, ctx.workdir / f"pub-{r}.log") as pub:
        pub.start()
        pub.wait_for("start", 60)
        time.sleep(1.0)  # the trainer is busy before the first request
        before, started = learner.metric(metric, model=MODEL), time.monotonic()
        load = run_load(ctx.load_client, url, body, CLIENTS, duration, ctx.workdir / "load")
        rate = (learner.metric(metric, model=MODEL) - before) / (time.monotonic() - started)
    if drain:  # the next run is idle only once the backlog is trained
        _drain(learner)
    return load, rate


def _drain(learner: LivefitProcess, timeout: float = 60.0) -> None:
    """Wait until the trainer has trained its backlog (the count stops moving, queue empty)."""
    deadline = time.monotonic() + timeout
    last = -1.0
    while time.monotonic() < deadline:
        trained = learner.metric("livefit_train_samples_total", model=MODEL)
        depth = learner.metric("livefit_queue_depth", model=MODEL)
        if trained == last and depth == 0:
            return
        last = trained
        time.sleep(0.3)


BENCHMARK = Benchmark(
    name="interference",
    summary="prediction p99 with the trainer saturated vs idle",
    run=run,
    sizes=Sizes(
        quick={"rounds": 1, "duration": 1.0},
        full={"rounds": 3, "duration": 4.0},
    ),
)
