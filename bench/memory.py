"""Benchmark 6, memory: the learner's RSS, all its processes together, over a long run.

Two learners of the same model, one after the other, each on a mosquitto started here: one
``livefit serve`` in one process (``http.workers = 0``), then the same learner split
(``http.workers = 1``: a parent supervising a training process and a serving process). For
each, a publisher process streams the samples (100-sample msgpack messages, paced to last
about as long as the requests) while a 16-client load (``bench.loadgen``, bounded by count)
sends the prediction requests. Every 0.25 s the resident set size of the learner's process and
of all its descendants (listed again at each sample: a child may restart) is read and summed;
each process is told apart by its role (the name livefit gives it). Warm-up is
the first quarter of the run (TensorFlow's allocator pools, the weight store's
``keep_versions`` payloads, Python's arenas all fill then); growth is the median total RSS of
the last tenth of the run over the median of the tenth after warm-up. A sum of RSS counts the
pages processes share (the Python and TensorFlow libraries, mapped by each) once per process;
the proportional set size (PSS: shared pages divided among their processes), read once at the
end, is what they take together. ``--soak`` runs 1,000,000 samples and 200,000 requests.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import psutil

from bench.config import learner_config
from bench.fleet import bench_tables
from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread
from bench.load import run_load
from bench.models import MLP
from bench.procs import ToolProcess
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.fork_server import FORK_SERVER_NAME, SERVING_PREFIX, TRAINING_NAME

CLIENTS = 16
MODEL = "soak"
EXPECTED_RPS = 1500  # about livefit's requests/s here at 16 clients while training
MAIN = "main"  # the role of the process the bench starts: the whole learner, or the supervisor
LAYOUTS = {  # command -> http.workers
    "serve --workers 0": 0,
    "serve --workers 1": 1,
}


def role_of(process: psutil.Process, root_pid: int) -> str | None:
    """``main`` for the learner's own process; ``training``, ``serving <i>`` and ``fork
    server`` for a split learner's processes, told by the names livefit gives them
    (``fork_server.name_process``); None for any other (or for a child not yet named)."""
    if process.pid == root_pid:
        return MAIN
    name = process.name()
    if name == TRAINING_NAME:
        return "training"
    if name == FORK_SERVER_NAME:
        return "fork server"
    if name.startswith(SERVING_PREFIX):
        return f"serving {name.removeprefix(SERVING_PREFIX)}"
    return None


class TreeRssSampler:
    """Samples the RSS of a process and all its descendants in a thread until stopped.

    ``samples``: [(seconds since start, {role: bytes})], the descendants listed again at each
    sample (a restarted child is a new pid); ``pids``: every pid seen, by role."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.pids: dict[str, set[int]] = {}
        self._roles: dict[tuple[int, float], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def tree(self) -> list[tuple[str, psutil.Process]]:
        """The root and its descendants now, each with its role."""
        found = []
        for process in [self.root, *self.root.children(recursive=True)]:
            try:
                key = (process.pid, process.create_time())
                role = self._roles.get(key)
                if role is None:  # known roles are kept, unknown ones asked again
                    role = role_of(process, self.root.pid)
                    if role is not None:
                        self._roles[key] = role
                    else:
                        role = process.name()
            except psutil.NoSuchProcess:  # exited since it was listed
                continue
            found.append((role, process))
        return found

    def read(self) -> dict[str, int]:
        """RSS by role now (bytes); a role held by several processes is their sum."""
        rss: dict[str, int] = {}
        for role, process in self.tree():
            try:
                rss[role] = rss.get(role, 0) + process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            self.pids.setdefault(role, set()).add(process.pid)
        return rss

    def pss(self) -> dict[str, int]:
        """Proportional set size by role now (bytes): each shared page divided among the
        processes that map it (``/proc/<pid>/smaps_rollup``); slower than ``read``."""
        pss: dict[str, int] = {}
        for role, process in self.tree():
            try:
                pss[role] = pss.get(role, 0) + process.memory_full_info().pss
            except psutil.NoSuchProcess:
                continue
        return pss

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            try:
                rss = self.read()
            except psutil.NoSuchProcess:  # the root itself is gone
                return
            self.samples.append((time.monotonic() - started, rss))
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreeRssSampler:
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
        sides={
            "serve --workers 0": "`livefit serve` in one process (`http.workers = 0`), "
            "training and serving at once; `main` is that process",
            "serve --workers 1": "the same learner with `http.workers = 1`: `main` is the "
            "supervisor, `fork server` the process both others are forked from "
            "(`processes.preload`), `training` the training process, `serving 0` the serving "
            "process; RSS and PSS are their sums",
        },
        settings={
            "model": spec.describe(),
            "samples": samples,
            "requests": requests,
            "clients": CLIENTS,
            "sampling": "RSS of the process tree every 0.25 s (psutil), PSS once at the end",
        },
    )
    with ctx.fleet(MODEL) as fleet:
        _measure(
            ctx, result, "serve --workers 0", fleet.learner, fleet.broker.url, samples, requests
        )
    # The split learner gets the one-process learner's config of a full run, on its own broker
    # and storage (a quick run's shared split learner holds every benchmark's models).
    text = learner_config("mqtt://127.0.0.1:1", "-", "bench-memory", bench_tables((MODEL,)))
    command = "serve --workers 1"
    with ctx.split_learner(text, "split-learner") as (broker, split):
        _measure(ctx, result, command, split, broker.url, samples, requests)
    return result


def _measure(
    ctx: Context, result: BenchResult, command: str, learner: LivefitProcess, broker_url: str,
    samples: int, requests: int,
) -> None:  # fmt: skip
    """One layout's run: a row, its checks, its series in ``extra``."""
    spec = MLP
    labels = {"model": MODEL, **({"worker": "training"} if LAYOUTS[command] else {})}
    url = f"{learner.url}/v1/models/{MODEL}:predict"
    base = learner.metric("livefit_train_samples_total", **labels)
    with TreeRssSampler(learner.pid) as sampler:
        served = _workload(
            ctx, learner, broker_url, url, spec.request_body(), samples, requests, base, labels
        )
        pss = sampler.pss()
    trained = learner.metric("livefit_train_samples_total", **labels) - base
    row = _row(sampler.samples, pss, command, samples, requests)
    result.rows.append(row)
    result.check(
        f"{command}: every sample was trained", trained == samples, f"{trained:.0f} of {samples}"
    )
    result.check(
        f"{command}: every request was answered 200",
        served[1] == 0,
        f"{served[0]} answered, {served[1]} errors",
    )
    restarted = {role: sorted(pids) for role, pids in sampler.pids.items() if len(pids) > 1}
    result.check(
        f"{command}: no process restarted during the run",
        not restarted,
        ", ".join(f"{role}: {_processes(len(pids))}" for role, pids in sampler.pids.items()),
    )
    roles = sorted({r for _, rss in sampler.samples for r in rss}, key=_role_order)
    series = sampler.samples[:: max(1, len(sampler.samples) // 400)]
    result.extra.setdefault("rss_mib", {})[command] = {
        "columns": ["s", "total", *roles],
        "series": [
            [round(t, 2), _mib(sum(rss.values())), *(_mib(rss.get(r, 0)) for r in roles)]
            for t, rss in series
        ],
        "pss_at_end": {role: _mib(b) for role, b in pss.items()},
    }
    ctx.step(
        f"{command}: total RSS after warm-up {row.figures['RSS after warm-up MiB'].median:.0f}"
        f" MiB, at end {row.figures['RSS at end MiB'].median:.0f} MiB: growth "
        f"{row.figures['growth %'].median:+.2f}%; PSS at end "
        f"{row.figures['PSS at end MiB'].median:.0f} MiB"
    )


def _workload(
    ctx: Context,
    learner: LivefitProcess,
    broker_url: str,
    url: str,
    body: bytes,
    samples: int,
    requests: int,
    base: float,
    labels: dict[str, str],
) -> tuple[int, int]:
    """Publish ``samples`` and send ``requests`` at once; wait until every sample is trained
    (``livefit_train_samples_total`` with ``labels``, from ``base``)."""
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
    log = ctx.workdir / f"publisher-{learner.name}.log"
    with ToolProcess("bench.stream_publisher", args, log) as pub:
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
    while learner.metric("livefit_train_samples_total", **labels) - base < samples:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return load.requests, load.errors


def _row(
    series: list[tuple[float, dict[str, int]]], pss: dict[str, int], command: str,
    samples: int, requests: int,
) -> Row:  # fmt: skip
    """The total RSS's figures and its growth target; each role's RSS at the end."""
    times = np.asarray([t for t, _ in series])
    rss = np.asarray([sum(r.values()) for _, r in series], dtype=np.float64) / 2**20
    end = times[-1]
    after_warmup = (times >= 0.25 * end) & (times < 0.35 * end)
    last = times >= 0.9 * end
    base, final = float(np.median(rss[after_warmup])), float(np.median(rss[last]))
    row = Row(case={"samples": f"{samples:,}", "requests": f"{requests:,}", "command": command})
    row.figures["RSS at start MiB"] = Spread.of([float(rss[0])], "MiB")
    row.figures["RSS after warm-up MiB"] = Spread.of([base], "MiB")
    row.figures["RSS at end MiB"] = Spread.of([final], "MiB")
    row.figures["peak MiB"] = Spread.of([float(rss.max())], "MiB")
    row.figures["growth %"] = Spread.of([100.0 * (final / base - 1.0)], "%")
    row.figures["PSS at end MiB"] = Spread.of([_mib(sum(pss.values()))], "MiB")
    roles = sorted({r for _, by_role in series for r in by_role}, key=_role_order)
    for role in roles:
        at_end = [by_role.get(role, 0) / 2**20 for t, by_role in series if t >= 0.9 * end]
        row.figures[f"{role} RSS at end MiB"] = Spread.of([float(np.median(at_end))], "MiB")
    row.target("growth %", "<", 5.0, "growth < 5% after warm-up")
    return row


def _role_order(role: str) -> tuple[int, str]:
    """``main``, ``training``, the serving processes, anything else."""
    rank = {MAIN: 0, "training": 1}.get(role, 2 if role.startswith("serving ") else 3)
    return rank, role


def _processes(count: int) -> str:
    return f"{count} process" + ("" if count == 1 else "es")


def _mib(size: float) -> float:
    return round(size / 2**20, 1)


BENCHMARK = Benchmark(
    name="memory",
    summary="learner RSS growth (all its processes) over a long run, one process and split",
    columns=(
        "RSS after warm-up MiB",
        "RSS at end MiB",
        "growth %",
    ),
    run=run,
    sizes=Sizes(
        quick={"samples": 20_000, "requests": 2_000},
        full={"samples": 300_000, "requests": 30_000},
        soak={"samples": 1_000_000, "requests": 200_000},
    ),
    explained_always=True,
)
