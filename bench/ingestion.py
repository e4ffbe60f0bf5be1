"""Benchmark 2, ingestion: samples/s from MQTT publish to trained, against a bare subscriber.

A mosquitto started here on a free port, one publisher process (livefit's ``SamplePublisher``,
QoS 1, window 1000, data generated before the clock starts) and, in turn:

* **livefit**: a real ``livefit serve`` process (default settings); the clock stops when its
  ``livefit_train_samples_total`` on ``/metrics`` has grown by every published sample (polled
  every 100 ms, every 10 ms near the end).
* **bare subscriber**: a paho client on the same broker (QoS 1, automatic acks) that only
  decodes each message and counts its samples: the ceiling for any consumer of this stream.

Each sample message format runs both sides once per round (order rotated); a side's figure is
published samples / (last sample consumed - first publish). Zero loss: livefit must have trained
exactly the samples published, and rejected none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.models import MLP
from bench.procs import ToolProcess
from livefit.local_servers import LivefitProcess

MODEL = "ingest"
MODEL_1K = "ingest1k"  # the same with train.max_batch_size 1024: what a bigger batch buys


@dataclass(frozen=True, slots=True)
class Format:
    """One kind of sample message."""

    label: str
    fmt: str
    batch: int
    raw: bool = False


FORMATS = (
    Format("single-sample JSON", "json", 1),
    Format("single-sample msgpack", "msgpack", 1),
    Format("100-sample msgpack", "msgpack", 100),
)


def run(ctx: Context) -> BenchResult:
    rounds = ctx.sizes["rounds"]
    counts = ctx.sizes["counts"]
    spec = MLP
    result = BenchResult(
        name="ingestion",
        title="Ingestion throughput",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={
            "livefit": "`livefit serve`, default settings (QoS 1, receive maximum 1000, queue "
            "capacity 20,000, `train.max_batch_size` 256, `max_wait_ms` 0)",
            "livefit, max_batch_size 1024": "the same process and settings, for a second model "
            "with `train.max_batch_size` 1024 (batched messages only; not judged)",
            "bare subscriber": "`bench/bare_subscriber.py`: paho 2, MQTT 5, QoS 1, auto-ack, "
            "`json.loads`/`msgpack.unpackb` and a sample count per message",
        },
        settings={
            "model": spec.describe(),
            "broker": "mosquitto (persistence off), loopback",
            "publisher": "SamplePublisher, QoS 1, window 1000, one process",
            "samples per run": f"{counts[1]:,} single, {counts[100]:,} batched",
            "rounds": rounds,
        },
    )
    work = ctx.workdir
    rates: dict[str, dict[str, list[float]]] = {f.label: {} for f in FORMATS}
    with ctx.fleet(MODEL, MODEL_1K) as fleet:
        broker, learner = fleet.broker, fleet.learner
        rejected_before = _rejected(learner)
        for r in range(rounds):
            for f in FORMATS:
                sides = ["livefit", "bare"] if r % 2 == 0 else ["bare", "livefit"]
                if f.batch > 1:
                    sides.append(MODEL_1K)
                for side in sides:
                    rate = _run_side(side, learner, broker.url, f, counts[f.batch], work, r, result)
                    rates[f.label].setdefault(side, []).append(rate)
                    ctx.step(
                        f"round {r + 1}/{rounds} {f.label:>22}: {side:>8} {rate:>10,.0f} samples/s"
                    )
        rejected = _rejected(learner) - rejected_before
        result.check("livefit rejected no message", rejected == 0, f"{rejected:.0f} rejected")
    result.merge_checks()
    for f in FORMATS:
        result.rows.append(_row(f, rates[f.label]))
    return result


def _run_side(
    side: str,
    learner: LivefitProcess,
    broker_url: str,
    f: Format,
    n: int,
    work: Path,
    r: int,
    result: BenchResult,
) -> float:
    if side == "bare":
        return _bare_run(broker_url, f, n, work, r)
    model = MODEL if side == "livefit" else MODEL_1K
    rate, lost = _livefit_run(learner, model, broker_url, f, n, work, r)
    result.check(
        f"livefit trained every published sample ({f.label}, {model})",
        lost == 0,
        f"{lost} lost or extra",
    )
    return rate


def _row(f: Format, rates: dict[str, list[float]]) -> Row:
    lf, bare = rates["livefit"], rates["bare"]
    row = Row(case={"messages": f.label})
    row.figures["livefit samples/s"] = Spread.of(lf, "samples/s")
    row.figures["bare subscriber samples/s"] = Spread.of(bare, "samples/s")
    if MODEL_1K in rates:
        row.figures["livefit, max_batch_size 1024"] = Spread.of(rates[MODEL_1K], "samples/s")
    row.ratios["livefit ÷ bare"] = paired_ratios(lf, bare)
    if MODEL_1K in rates:
        row.ratios["livefit 1024 ÷ bare"] = paired_ratios(rates[MODEL_1K], bare)
    row.target("livefit ÷ bare", ">=", 0.9, "≥ 0.9x bare subscriber, zero loss")
    return row


def _publisher(broker_url: str, topic: str, f: Format, n: int, log: Path) -> ToolProcess:
    args = [
        "--broker",
        broker_url,
        "--topic",
        topic,
        "--fmt",
        f.fmt,
        "--batch",
        f.batch,
        "--count",
        n,
    ]
    if f.raw:
        args.append("--raw")
    return ToolProcess("bench.stream_publisher", args, log)


def _livefit_run(
    learner: LivefitProcess, model: str, broker_url: str, f: Format, n: int, work: Path, r: int
) -> tuple[float, int]:
    metric = "livefit_train_samples_total"
    base = learner.metric(metric, model=model)
    log = work / f"pub-{model}-{r}.log"
    with _publisher(broker_url, f"livefit/{model}/samples", f, n, log) as pub:
        pub.start()
        started = float(pub.wait_for("start", 60).split()[1])
        done_at = _wait_trained(learner, model, metric, base + n, timeout=max(60.0, n / 500))
        pub.wait_for("end", 60)
    time.sleep(0.3)  # anything beyond n (duplicates) would show up now
    trained = learner.metric(metric, model=model) - base
    return n / (done_at - started), int(abs(trained - n))


def _wait_trained(
    learner: LivefitProcess, model: str, metric: str, target: float, timeout: float
) -> float:
    """Poll /metrics until ``metric`` reaches ``target``; the time.time() it was first seen."""
    deadline = time.monotonic() + timeout
    last, last_at, rate = learner.metric(metric, model=model), time.monotonic(), 0.0
    while True:
        value = learner.metric(metric, model=model)
        if value >= target:
            return time.time()
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(
                f"livefit trained {value:.0f} of {target:.0f} within {timeout:.0f} s"
            )
        if now > last_at and value > last:
            rate = (value - last) / (now - last_at)
        last, last_at = value, now
        near = rate > 0 and (target - value) / rate < 0.15
        time.sleep(0.01 if near else 0.1)


def _bare_run(broker_url: str, f: Format, n: int, work: Path, r: int) -> float:
    topic = "livefit/baresb/samples"  # as long as livefit's topic
    sub = ToolProcess(
        "bench.bare_subscriber",
        ["--broker", broker_url, "--topic", topic, "--expect", n, "--timeout", max(60.0, n / 500)],
        work / f"bare-{r}.log",
    )
    with sub, _publisher(broker_url, topic, f, n, work / f"pub-bare-{r}.log") as pub:
        sub.start()
        sub.wait_for("ready", 30)
        pub.start()
        started = float(pub.wait_for("start", 60).split()[1])
        done_at = float(sub.wait_for("done", max(60.0, n / 500)).split()[1])
        pub.wait_for("end", 60)
    return n / (done_at - started)


def _rejected(learner: LivefitProcess) -> float:
    return sum(
        value
        for (name, labels), value in learner.metrics().items()
        if name == "livefit_ingest_messages_total"
        and ("outcome", "rejected") in labels
        and dict(labels).get("model") in (MODEL, MODEL_1K)
    )


BENCHMARK = Benchmark(
    name="ingestion",
    summary="MQTT publish -> trained, vs a bare paho subscriber that only decodes",
    columns=(
        "livefit samples/s",
        "bare subscriber samples/s",
        "livefit ÷ bare",
    ),
    run=run,
    sizes=Sizes(
        quick={"rounds": 1, "counts": {1: 500, 100: 5_000}},
        full={"rounds": 3, "counts": {1: 20_000, 100: 300_000}},
    ),
)
