"""Benchmark 6, memory: the learner's RSS over a long run of training and predicting.

One ``livefit serve`` (default settings) on a mosquitto started here; at the same time a
publisher process streams the samples (100-sample msgpack messages, paced to last about as
long as the requests) and a 16-client load (``bench.loadgen``, bounded by count) sends the
prediction requests. The learner's resident set size is sampled every
0.25 s. Warm-up is the first quarter of the run (TensorFlow's allocator pools, the weight
store's ``keep_versions`` payloads, Python's arenas all fill then); growth is the median RSS of
the last tenth of the run over the median of the tenth after warm-up. ``--soak`` runs
1,000,000 samples and 200,000 requests.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import psutil

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread
from bench.load import run_load
from bench.models import MLP
from bench.procs import ToolProcess
from livefit.server.processes.local_processes import LivefitProcess

CLIENTS = 16
MODEL = "soak"
EXPECTED_RPS = 1500  # about livefit's requests/s here at 16 clients while training


class RssSampler:
    """Samples one process's RSS in a thread until stopped: [(seconds since start, bytes)]."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.process = psutil.Process(pid)
        self.every_s = every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic() - started, self.process.memory_info().rss))
            except psutil.Error:
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def run(ctx: Context) -> BenchResult:
    samples = ctx.sizes["samples"]
    requests = ctx.sizes["requests"]
    spec = MLP
    result = BenchResult(
        name="memory",
        title="Memory: learner RSS over a long run",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={"livefit": "`livefit serve`, default settings, training and serving at once"},
        settings={
            "model": spec.describe(),
            "samples": samples,
            "requests": requests,
            "clients": CLIENTS,
            "sampling": "RSS every 0.25 s (psutil)",
        },
    )
    with ctx.fleet(MODEL) as fleet:
        learner = fleet.learner
        url = f"{learner.url}/v1/models/{MODEL}:predict"
        base = learner.metric("livefit_train_samples_total", model=MODEL)
        with RssSampler(learner.pid) as sampler:
            served = _workload(
                ctx, learner, fleet.broker.url, url, spec.request_body(), samples, requests, base
            )
        trained = learner.metric("livefit_train_samples_total", model=MODEL) - base
    series = sampler.samples
    row = _row(series, samples, requests)
    result.rows.append(row)
    result.check("every sample was trained", trained == samples, f"{trained:.0f} of {samples}")
    result.check(
        "every request was answered 200",
        served[1] == 0,
        f"{served[0]} answered, {served[1]} errors",
    )
    result.extra["rss_mib"] = [
        (round(t, 2), round(b / 2**20, 1)) for t, b in series[:: max(1, len(series) // 400)]
    ]
    ctx.step(
        f"RSS after warm-up {row.figures['RSS after warm-up MiB'].median:.0f} MiB, at end "
        f"{row.figures['RSS at end MiB'].median:.0f} MiB: growth "
        f"{row.figures['growth %'].median:+.2f}%"
    )
    return result


def _workload(
    ctx: Context,
    learner: LivefitProcess,
    broker_url: str,
    url: str,
    body: bytes,
    samples: int,
    requests: int,
    base: float,
) -> tuple[int, int]:
    """Publish ``samples`` and send ``requests`` at once; wait until every sample is trained."""
    # Paced so that training goes on for about as long as the requests do.
    rate = samples / max(5.0, requests / EXPECTED_RPS)
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
        samples,
        "--rate",
        f"{rate:.0f}",
    ]
    with ToolProcess("bench.stream_publisher", args, ctx.workdir / "publisher.log") as pub:
        pub.start()
        pub.wait_for("start", 60)
        load = run_load(
            ctx.load_client,
            url,
            body,
            CLIENTS,
            duration_s=max(30.0, requests / 50),
            workdir=ctx.workdir / "load",
            max_requests=requests,
        )
        ctx.step(f"{load.requests:,} requests answered at {load.rps:,.0f} req/s")
        pub.wait_for("end", max(120.0, samples / 1000))
    deadline = time.monotonic() + 120
    while learner.metric("livefit_train_samples_total", model=MODEL) - base < samples:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return load.requests, load.errors


def _row(series: list[tuple[float, int]], samples: int, requests: int) -> Row:
    times = np.asarray([t for t, _ in series])
    rss = np.asarray([b for _, b in series], dtype=np.float64) / 2**20
    end = times[-1]
    after_warmup = rss[(times >= 0.25 * end) & (times < 0.35 * end)]
    last = rss[times >= 0.9 * end]
    base, final = float(np.median(after_warmup)), float(np.median(last))
    row = Row(case={"samples": f"{samples:,}", "requests": f"{requests:,}"})
    row.figures["RSS at start MiB"] = Spread.of([float(rss[0])], "MiB")
    row.figures["RSS after warm-up MiB"] = Spread.of([base], "MiB")
    row.figures["RSS at end MiB"] = Spread.of([final], "MiB")
    row.figures["peak MiB"] = Spread.of([float(rss.max())], "MiB")
    row.figures["growth %"] = Spread.of([100.0 * (final / base - 1.0)], "%")
    row.target("growth %", "<", 5.0, "growth < 5% after warm-up")
    return row


BENCHMARK = Benchmark(
    name="memory",
    summary="learner RSS growth over a long run of training and predicting",
    run=run,
    sizes=Sizes(
        quick={"samples": 20_000, "requests": 2_000},
        full={"samples": 300_000, "requests": 30_000},
        soak={"samples": 1_000_000, "requests": 200_000},
    ),
)
