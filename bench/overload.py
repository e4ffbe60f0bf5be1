"""Benchmark 8, overload: goodput, refusals and recovery at 1x, 2x and 3x capacity, open loop.

One ``livefit serve`` (default settings) on a mosquitto started here. Each round first measures
the **capacity**: successful requests/s of a closed loop of 64 keep-alive connections (the
serving benchmark's client), with its p99. Then, for each multiple of that rate, an
**open-loop** generator (``bench/openloop.py``, its own process) sends one-row requests at a
fixed rate whatever the server answers, so a slow server faces a growing backlog as it would in
production (a closed loop slows down with the server and hides collapse). Latency counts from
when a request was due. **Goodput** is 200s within the request deadline (5 s, the default) per
second of the run. After the load stops, one probe request every 10 ms measures the
**recovery**: the time until five probes in a row are answered 200 within twice the p99 at
capacity. Then a closed loop of 64 connections checks the server is back at full speed. The
learner's RSS is sampled every 0.25 s throughout. Last in each round, the capacity run is
repeated while thousands of slow clients (the slowloris pattern) hold connections. With
HAProxy installed, each open-loop run is also made through **HAProxy in front** of the same
server (``bench/haproxy_front.py``: at most 64 requests in flight at the server, the rest queued
in the proxy and refused there with 429 and ``Retry-After`` once 512 wait or one has waited
1 s), in the same rounds, right after the direct run at the same rate. Each runtime
(``serve.runtime`` "auto", the default: a NumPy forward pass called on the event loop, and
"keras", the graph on the model thread of before) is a model of the same server, measured in
turn in each round with a capacity of its own.

**What a refusal costs against an answer.** The learner's CPU time (user + system, all its
threads, from psutil, less its idle rate) is read around each run: per 200 in the capacity run,
*a*; per 429 in a run where every request is refused, *r* (a model whose one queued request
waits 10 s for company and whose queue holds one row, so the rest are refused from the head;
the open-loop client at twice the first runtime's capacity, the refusal rate of a 3x run, on
keep-alive connections as in the overload runs). When one event loop bounds the capacity
(C = 1/a), at m times the capacity it must spend g·a + (mC - g)·r ≤ 1 second per second, so
goodput ÷ capacity ≤ (1 - m·r/a) / (1 - r/a): the **bound** shown beside the measured goodput.
During each open-loop run the client also records how late it sent each request (its own loop
behind), and the learner's sockets are sampled every 0.25 s from ``/proc/net/tcp``: bytes
received but not yet read by the server (requests waiting for the event loop) and the accept
queue of its listening socket; by Little's law, requests unread on average ÷ the offered rate
is the mean time a request waited in the socket buffers. The event loop thread's
``schedstat`` gives its share of the run spent running and spent ready but waiting for a core
(taken by the client or other processes), and the client's own CPU per request is counted.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench import haproxy_front
from bench.harness import REPO, Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.load import LoadResult, run_load
from bench.models import MLP, ModelSpec
from bench.procs import QUIET_ENV
from bench.slow_clients import SLOW_LINE_S, slow_row, with_slow_clients
from livefit.local_servers import LivefitProcess
from livefit.server.config.model_tables import ServeSettings

MODEL = "over"
# serve.runtime -> the model served with it: the default (a NumPy forward pass on the event
# loop for this MLP) and the Keras graph on the model thread of before, side by side
RUNTIME_MODELS = {"auto": MODEL, "keras": "over_keras"}
REFUSE_MODEL = "over_refuse"  # refuses everything but one request every 10 s (bench/fleet.py)
CAPACITY_CLIENTS = 64
DEADLINE_MS = ServeSettings().default_deadline_ms
TARGET_MULTIPLIER = 3
TARGETS = {
    "goodput ÷ capacity": (">=", 0.8, "goodput ≥ 0.8x capacity"),
    "429 p99 ms": ("<=", 50.0, "429 p99 ≤ 50 ms"),
    "200 p99 ÷ capacity p99": ("<=", 2.0, "200 p99 ≤ 2x p99 at capacity"),
    "recovery s": ("<=", 1.0, "back to full speed within 1 s"),
    "RSS growth MiB": ("<=", 100.0, "memory bounded: RSS growth ≤ 100 MiB"),
}
RECOVERY_RUN = 5  # probes in a row that must be good
MAX_CONNECTIONS = 1000  # the open-loop client's, as http.max_connections
SLOW_CLIENTS = 2000  # connections sending their request head one line every SLOW_LINE_S


def run(ctx: Context) -> BenchResult:
    rounds = ctx.sizes["rounds"]
    capacity_seconds = ctx.sizes["capacity_seconds"]
    multipliers = ctx.sizes["multipliers"]
    slow_clients = ctx.sizes["slow_clients"]
    spec = MLP
    result = _result(ctx, spec)
    body = spec.request_body()
    runtimes = ctx.sizes["runtimes"]
    fronts = [f for f in ctx.sizes["fronts"] if f == "direct" or haproxy_front.available()]
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {
        (rt, f, m): [] for rt in runtimes for f in fronts for m in multipliers
    }
    slow: list[dict[str, Any]] = []
    capacities: list[LoadResult] = []
    costs: dict[str, list[dict[str, float]]] = {rt: [] for rt in runtimes}  # a, per round
    refusal_costs: list[dict[str, float]] = []  # r, per round
    models = [RUNTIME_MODELS[rt] for rt in runtimes] + [REFUSE_MODEL]
    with ctx.fleet(*models) as fleet, contextlib.ExitStack() as stack:
        learner = fleet.learner
        urls: dict[tuple[str, str], str] = {}
        for rt in runtimes:
            urls[rt, "direct"] = f"{learner.url}/v1/models/{RUNTIME_MODELS[rt]}:predict"
        if "haproxy" in fronts:
            front = stack.enter_context(
                haproxy_front.haproxy_front(learner.port, ctx.workdir / "haproxy")
            )
            for rt in runtimes:
                urls[rt, "haproxy"] = f"{front.url}/v1/models/{RUNTIME_MODELS[rt]}:predict"
        load_dir = ctx.workdir / "load"
        refuse_url = f"{learner.url}/v1/models/{REFUSE_MODEL}:predict"
        if not ctx.quick:  # first calls and connection setup are not measured
            for rt in runtimes:
                run_load(ctx.load_client, urls[rt, "direct"], body, 16, 1.0, load_dir)
        cpu = _CpuMeter(learner)
        for r in range(rounds):
            for rt in runtimes:
                url, model = urls[rt, "direct"], RUNTIME_MODELS[rt]
                cpu.idle()
                with cpu.measure() as used:
                    capacity = run_load(
                        ctx.load_client, url, body, CAPACITY_CLIENTS, capacity_seconds, load_dir
                    )
                capacities.append(capacity)
                costs[rt].append(_per_request(used, capacity.requests - capacity.non_200))
                cap_rps, cap_p99 = capacity.ok_rps, capacity.p99_ms
                ctx.step(
                    f"round {r + 1}/{rounds} {rt} capacity: {cap_rps:,.0f} req/s, "
                    f"p99 {cap_p99:.1f} ms, CPU per answer {costs[rt][-1]['us']:.0f} µs "
                    f"({costs[rt][-1]['cores']:.2f} cores)"
                )
                if rt == runtimes[0]:  # refusals only, at the refusal rate of a 3x run
                    refusal_costs.append(
                        _refusal_cost(cpu, refuse_url, body, 2 * cap_rps, ctx, load_dir)
                    )
                    ctx.step(
                        f"round {r + 1}/{rounds} refusals only at {2 * cap_rps:,.0f} req/s: "
                        f"CPU per refusal {refusal_costs[-1]['us']:.0f} µs "
                        f"(user {refusal_costs[-1]['user_us']:.0f}, system "
                        f"{refusal_costs[-1]['system_us']:.0f}; "
                        f"{refusal_costs[-1]['cores']:.2f} cores), 429 p99 "
                        f"{refusal_costs[-1]['shed_p99_ms']:.1f} ms"
                    )
                for m in multipliers:
                    for f in fronts:
                        over = _overloaded(ctx, learner, urls[rt, f], url, body, m, capacity)
                        over["front"], over["runtime"] = f, rt
                        over["cpu_per_answer_us"] = costs[rt][-1]["us"]
                        over["cpu_per_refusal_us"] = refusal_costs[-1]["us"]
                        over["cores_at_capacity"] = costs[rt][-1]["cores"]
                        runs[rt, f, m].append(over)
                        ctx.step(_line(r, rounds, over))
                        _settle(learner, model)
            url = urls[runtimes[0], "direct"]
            cap = capacities[-len(runtimes)]
            load = partial(run_load, ctx.load_client, url, body, CAPACITY_CLIENTS)
            slow.append(with_slow_clients(learner, slow_clients, cap, load, ctx.workdir))
            ctx.step(
                f"round {r + 1}/{rounds} {slow_clients:,} slow clients: "
                f"{slow[-1]['rps']:,.0f} req/s ({slow[-1]['rps'] / cap.ok_rps:.2f}x), p99 "
                f"{slow[-1]['p99_ms']:.1f} ms, {slow[-1]['descriptors']} more descriptors, "
                f"{slow[-1]['still_connected']} slow ones still connected"
            )
    for rt in runtimes:
        for f in fronts:
            for m in multipliers:
                direct = runs[rt, "direct", m] if f != "direct" else None
                result.rows.append(_row(rt, f, m, runs[rt, f, m], direct))
    result.rows.append(_refusal_row(refusal_costs))
    result.rows.append(slow_row(slow_clients, CAPACITY_CLIENTS, MAX_CONNECTIONS, slow))
    _check_answers(result, [o for v in runs.values() for o in v])
    result.extra["capacity"] = [c.to_json() for c in capacities]
    result.extra["cpu_per_answer"] = costs
    result.extra["cpu_per_refusal"] = refusal_costs
    result.extra["slow_clients"] = slow
    result.extra["runs"] = {f"{rt} {f} {m}": v for (rt, f, m), v in runs.items()}
    return result


def _overloaded(
    ctx: Context, learner: LivefitProcess, url: str, direct_url: str, body: bytes, m: float,
    capacity: LoadResult,
) -> dict[str, Any]:  # fmt: skip
    """One open-loop run at ``m`` times the capacity to ``url``, then the capacity run again
    (to the server itself, ``direct_url``)."""
    s = ctx.sizes
    load_dir = ctx.workdir / "load"
    cap_rps, cap_p99, probe_s = capacity.ok_rps, capacity.p99_ms, s["probe_s"]
    with _RssSampler(learner, _request_bytes(url, body)) as rss:
        over = _open_loop(url, body, m * cap_rps, s["seconds"], probe_s, load_dir, s["connections"])
    after = run_load(
        ctx.load_client, direct_url, body, CAPACITY_CLIENTS, s["capacity_seconds"], load_dir
    )
    over.update(
        multiplier=m,
        capacity_rps=cap_rps,
        capacity_p99_ms=cap_p99,
        recovery_s=_recovery(over["probes"], 2 * cap_p99, probe_s),
        after_rps=after.ok_rps,
        rss_mib=rss.summary(),
        sockets=rss.sockets(s["seconds"]),
        event_loop=rss.event_loop(over["started_at"], s["seconds"]),
    )
    return over


class _CpuMeter:
    """The learner's CPU time (user and system, all threads), less what it uses idle."""

    def __init__(self, server: LivefitProcess) -> None:
        import psutil

        self.process = psutil.Process(server.pid)
        self.idle_rate = (0.0, 0.0)  # user, system CPU seconds per second when idle

    def _times(self) -> tuple[float, float, float]:
        t = self.process.cpu_times()
        return time.monotonic(), t.user, t.system

    def idle(self, seconds: float = 1.0) -> None:
        """Measure the idle rate (MQTT, timers, the lag watch) over ``seconds`` of no load."""
        t0, u0, s0 = self._times()
        time.sleep(seconds)
        t1, u1, s1 = self._times()
        self.idle_rate = ((u1 - u0) / (t1 - t0), (s1 - s0) / (t1 - t0))

    @contextlib.contextmanager
    def measure(self) -> Any:
        """Yields a dict filled on exit: ``user``, ``system`` (CPU seconds above the idle
        rate) and ``seconds`` (wall)."""
        used: dict[str, float] = {}
        t0, u0, s0 = self._times()
        yield used
        t1, u1, s1 = self._times()
        dt = t1 - t0
        used.update(
            seconds=dt,
            user=max(0.0, u1 - u0 - self.idle_rate[0] * dt),
            system=max(0.0, s1 - s0 - self.idle_rate[1] * dt),
        )


def _per_request(
    used: dict[str, float], requests: int, seconds: float | None = None
) -> dict[str, float]:
    """CPU µs per request (all, user, system), and the cores used on average over ``seconds``
    of load (the whole measurement when not given)."""
    n = max(1, requests)
    return {
        "us": (used["user"] + used["system"]) / n * 1e6,
        "user_us": used["user"] / n * 1e6,
        "system_us": used["system"] / n * 1e6,
        "cores": (used["user"] + used["system"]) / (seconds or used["seconds"]),
        "requests": float(requests),
    }


def _refusal_cost(
    cpu: _CpuMeter, url: str, body: bytes, rate: float, ctx: Context, workdir: Path
) -> dict[str, float]:
    """CPU per 429 in an open-loop run where every request but about one in 10 s is refused
    from its head (``REFUSE_MODEL``), at ``rate``."""
    s = ctx.sizes
    cpu.idle()
    with cpu.measure() as used:
        run = _open_loop(
            url, body, rate, s["refusal_seconds"], 0.0, workdir, s["connections"], 1000.0
        )
    refused = _count(run, "429")
    cost = _per_request(used, refused, s["refusal_seconds"])
    cost.update(
        rate=rate,
        refused=float(refused),
        answered=float(_count(run, "200")),
        shed_p50_ms=run["shed_p50_ms"] or float("nan"),
        shed_p99_ms=run["shed_p99_ms"] or float("nan"),
    )
    return cost


def _request_bytes(url: str, body: bytes) -> int:
    from bench.loadgen import post_request

    return len(post_request(url, body)[2])


def bound(m: float, ratio: float) -> float:
    """The most goodput ÷ capacity one event loop can give at ``m`` times its capacity when a
    refusal costs ``ratio`` of an answer: g·a + (mC - g)·r ≤ 1 with C = 1/a."""
    if m <= 1:
        return 1.0
    if ratio >= 1:
        return 0.0
    return max(0.0, (1 - m * ratio) / (1 - ratio))


def _refusal_row(costs: list[dict[str, float]]) -> Row:
    """The refusal-only runs: CPU per 429 and its 429 latency."""
    row = Row(case={"runtime": "any", "front": "direct", "load": "refusals only (2x capacity)"})
    f = row.figures
    f["offered req/s"] = Spread.of([c["rate"] for c in costs], "req/s")
    f["CPU µs per 429 (r)"] = Spread.of([c["us"] for c in costs], "µs")
    f["of which system µs"] = Spread.of([c["system_us"] for c in costs], "µs")
    f["server cores"] = Spread.of([c["cores"] for c in costs], "")  # while refusing
    f["429 p50 ms"] = Spread.of([c["shed_p50_ms"] for c in costs], "ms")
    f["429 p99 ms"] = Spread.of([c["shed_p99_ms"] for c in costs], "ms")
    return row


def _check_answers(result: BenchResult, shed: list[dict[str, Any]]) -> None:
    """Every 429 carried Retry-After; nothing but 200, 429 and 504 came back."""
    missing = sum(o["shed_without_retry_after"] for o in shed)
    result.check("every 429 carried Retry-After", missing == 0, f"{missing} without")
    others = sum(
        n for o in shed for s, n in o["counts"].items() if s not in ("200", "429", "504", "0", "-1")
    )
    result.check("no answer other than 200, 429 or 504 (no 5xx)", others == 0, f"{others} others")


def _result(ctx: Context, spec: ModelSpec) -> BenchResult:
    """The result, before any measurement: sides and settings."""
    s = ctx.sizes
    rounds, seconds, connections = s["rounds"], s["seconds"], s["connections"]
    capacity_seconds, slow_clients = s["capacity_seconds"], s["slow_clients"]
    return BenchResult(
        name="overload",
        title="Overload: goodput past capacity",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={
            "capacity": f"closed loop, {CAPACITY_CLIENTS} keep-alive connections, "
            f"{capacity_seconds:g} s ({ctx.load_client} client): successful requests/s and p99",
            "open loop": f"`bench.openloop`: the capacity times 1, 2, 3, fixed rate, {seconds:g} s "
            f"each; {connections} keep-alive connections opened before the clock starts, more "
            f"as needed (at most {MAX_CONNECTIONS:,}); deadline {DEADLINE_MS:g} ms",
            "haproxy": "the same open-loop runs through HAProxy "
            f"{_haproxy_version()} in front (1 thread; `maxconn` "
            f"{haproxy_front.SERVER_MAXCONN} at the server, `timeout queue` "
            f"{haproxy_front.QUEUE_TIMEOUT_MS} ms, then 429 with Retry-After; 429 at once when "
            f"more than {haproxy_front.QUEUE_REFUSE_AT} wait), right after each direct run",
            "slow clients": f"{slow_clients:,} connections that each send a request line, then "
            f"one header line every {SLOW_LINE_S:g} s, never finishing, opened first; then the "
            "capacity run again (the server's descriptors counted with psutil)",
        },
        settings={
            "runtimes": "`serve.runtime` auto (the default: NumPy on the event loop) and keras "
            "(the graph on the model thread), two models of the same server, in turn",
            "server": "`livefit serve`, default settings (admission by expected wait, "
            "`serve.max_queue_wait_ms` auto, `max_queue_rows` 4096, deadline 5 s)",
            "model": spec.describe(),
            "request": "one row, TF Serving `instances` JSON",
            "rounds": rounds,
        },
    )


def _haproxy_version() -> str:
    if not haproxy_front.available():
        return "(not installed: side skipped)"
    done = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, timeout=10)
    return done.stdout.split()[2] if done.returncode == 0 else "(version unknown)"


def _count(run: dict[str, Any], status: str) -> int:
    return int(run["counts"].get(status, 0))


def _open_loop(
    url: str, body: bytes, rate: float, seconds: float, probe_s: float, workdir: Path,
    connections: int, deadline_ms: float = DEADLINE_MS,
) -> dict[str, Any]:  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    body_file = workdir / "body.json"
    body_file.write_bytes(body)
    argv = [
        sys.executable, "-m", "bench.openloop", "--url", url, "--body-file", str(body_file),
        "--rate", f"{rate:.1f}", "--duration", str(seconds), "--deadline-ms", str(deadline_ms),
        "--probe-s", str(probe_s), "--connections", str(connections),
        "--max-conns", str(MAX_CONNECTIONS),
    ]  # fmt: skip
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=seconds + probe_s + deadline_ms / 1000 + 60,
        cwd=REPO, env={**_environ(), **QUIET_ENV},
    )  # fmt: skip
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"open-loop client failed ({done.returncode}): {done.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(line)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the client's CPU, its start and probes included (it runs on the server's cores)
    data["client_cpu_s"] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return data


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _recovery(probes: list[list[float]], ok_ms: float, probe_s: float) -> float:
    """Seconds from the end of the load until the first of ``RECOVERY_RUN`` probes in a row
    answered 200 within ``ok_ms`` came back; ``probe_s`` when that never happened."""
    good = [p[2] == 200 and p[1] <= ok_ms for p in probes]
    for i in range(len(probes) - RECOVERY_RUN + 1):
        if all(good[i : i + RECOVERY_RUN]):
            return max(0.0, probes[i][0] + probes[i][1] / 1000.0)
    return probe_s


class _RssSampler:
    """The server's RSS every 0.25 s while the block runs: start, peak and end (MiB); with it,
    its sockets (``/proc/net/tcp``): bytes received and not yet read by the server, and the
    accept queue of its listening socket."""

    def __init__(self, server: LivefitProcess, request_bytes: int = 0) -> None:
        import psutil

        self.process = psutil.Process(server.pid)
        self.port = f":{server.port:04X} "
        self.request_bytes = request_bytes
        self.proc_net_tcp = "/proc/net/tcp"
        self.unread: list[int] = []  # bytes received by the server's sockets, unread
        self.backlog: list[int] = []  # connections waiting in the accept queue
        # (when, CPU s, run-queue wait s) of the main thread (the event loop), schedstat
        self.schedstat = f"/proc/{server.pid}/task/{server.pid}/schedstat"
        self.loop: list[tuple[float, float, float]] = []
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(self.process.memory_info().rss / 2**20)
            self._sample_sockets()
            self._sample_loop()
            if self._stop.wait(0.25):
                self.samples.append(self.process.memory_info().rss / 2**20)
                return

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def summary(self) -> dict[str, float]:
        return {"start": self.samples[0], "peak": max(self.samples), "end": self.samples[-1]}

    def _sample_sockets(self) -> None:
        unread = backlog = 0
        try:
            with open(self.proc_net_tcp) as handle:
                next(handle)
                for line in handle:
                    fields = line.split(None, 5)
                    if not (fields[1] + " ").endswith(self.port):
                        continue  # not a server-side socket (a client's local port differs)
                    rx = int(fields[4].partition(":")[2], 16)
                    if fields[3] == "0A":  # listening: rx is the accept queue's length
                        backlog += rx
                    elif fields[3] == "01":
                        unread += rx
        except OSError:
            return
        self.unread.append(unread)
        self.backlog.append(backlog)

    def _sample_loop(self) -> None:
        try:
            with open(self.schedstat) as handle:
                ran, waited, _ = handle.read().split()
        except (OSError, ValueError):
            return
        self.loop.append((time.monotonic(), int(ran) / 1e9, int(waited) / 1e9))

    def event_loop(self, start: float, seconds: float) -> dict[str, float]:
        """Over the samples within ``seconds`` from ``start`` (monotonic): the share of the
        time the event loop's thread ran, and the share it was ready to run but waited for a
        core (taken by other processes); with ``idle`` the rest."""
        inside = [x for x in self.loop if start <= x[0] <= start + seconds]
        if len(inside) < 2:
            return {}
        (t0, ran0, waited0), (t1, ran1, waited1) = inside[0], inside[-1]
        ran, waited = (ran1 - ran0) / (t1 - t0), (waited1 - waited0) / (t1 - t0)
        return {"ran": ran, "waited": waited, "idle": max(0.0, 1.0 - ran - waited)}

    def sockets(self, seconds: float) -> dict[str, float]:
        """Over the samples of the first ``seconds`` (the load): requests waiting unread in
        the server's sockets, mean and peak, and the accept queue's peak."""
        n = max(1, min(len(self.unread), int(seconds / 0.25)))
        per = max(1, self.request_bytes)
        unread = self.unread[:n] or [0]
        return {
            "unread_requests_mean": sum(unread) / len(unread) / per,
            "unread_requests_peak": max(unread) / per,
            "accept_queue_peak": float(max(self.backlog[:n] or [0])),
        }


def _settle(server: LivefitProcess, model: str, timeout: float = 30.0) -> None:
    """Wait until nothing is queued for ``model`` (the next run starts from empty)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.metric("livefit_predict_queue_rows", model=model) == 0:
            return
        time.sleep(0.1)


def _line(r: int, rounds: int, o: dict[str, Any]) -> str:
    shed = f"{o['shed_p99_ms']:.1f}" if o["shed_p99_ms"] is not None else "-"
    ok = f"{o['ok_p99_ms']:.1f}" if o["ok_p99_ms"] is not None else "-"
    rate = o["offered"] / o["seconds"]
    return (
        f"round {r + 1}/{rounds} {o['runtime']} {o['front']} {o['multiplier']}x "
        f"({rate:,.0f} req/s): "
        f"goodput {o['goodput']:,.0f} req/s ({o['goodput'] / o['capacity_rps']:.2f}x), "
        f"200 p99 {ok} ms, 429 p99 {shed} ms, counts {o['counts']}, "
        f"recovery {o['recovery_s']:.2f} s, after {o['after_rps']:,.0f} req/s, "
        f"unread {o['sockets']['unread_requests_mean']:.0f} req (mean), accept queue "
        f"{o['sockets']['accept_queue_peak']:.0f} (peak), 429 p99 sent late "
        f"{o.get('shed_sent_late_p99_ms') or 0:.1f} ms, "
        f"RSS +{o['rss_mib']['peak'] - o['rss_mib']['start']:.0f} MiB"
    )


def _answered(run: dict[str, Any]) -> float:
    """Requests answered (any status) per second of the run."""
    return sum(n for s, n in run["counts"].items() if s not in ("0", "-1")) / run["seconds"]


def _row(
    runtime: str, front: str, m: int, runs: list[dict[str, Any]],
    direct: list[dict[str, Any]] | None = None,
) -> Row:  # fmt: skip
    """One runtime and front at one load; beside ``direct`` (the same rounds without a
    front), the ratios of the pairs."""
    row = Row(case={"runtime": runtime, "front": front, "load": f"{m}x capacity"})
    f = row.figures
    f["capacity req/s"] = Spread.of([o["capacity_rps"] for o in runs], "req/s")
    f["offered req/s"] = Spread.of([o["offered"] / o["seconds"] for o in runs], "req/s")
    f["goodput req/s"] = Spread.of([o["goodput"] for o in runs], "req/s")
    f["200 p99 ms"] = Spread.of([o["ok_p99_ms"] or float("nan") for o in runs], "ms")
    shed_p50 = [o["shed_p50_ms"] for o in runs if o["shed_p50_ms"] is not None]
    shed_p99 = [o["shed_p99_ms"] for o in runs if o["shed_p99_ms"] is not None]
    if shed_p99:
        f["429 p50 ms"] = Spread.of(shed_p50, "ms")
        f["429 p99 ms"] = Spread.of(shed_p99, "ms")
    f["429 share"] = Spread.of([_count(o, "429") / max(1, o["offered"]) for o in runs], "")
    f["504 or lost"] = Spread.of(
        [float(_count(o, "504") + _count(o, "0") + _count(o, "-1")) for o in runs], ""
    )
    f["RSS growth MiB"] = Spread.of(
        [o["rss_mib"]["peak"] - o["rss_mib"]["start"] for o in runs], "MiB"
    )
    f["recovery s"] = Spread.of([o["recovery_s"] for o in runs], "s")
    if front == "direct":
        f["CPU µs per 200 (a)"] = Spread.of([o["cpu_per_answer_us"] for o in runs], "µs")
        f["CPU µs per 429 (r)"] = Spread.of([o["cpu_per_refusal_us"] for o in runs], "µs")
        # 1 would mean the one event loop's core bounds the capacity (the bound's premise)
        f["server cores at capacity"] = Spread.of([o["cores_at_capacity"] for o in runs], "")
    late = [o["shed_sent_late_p99_ms"] for o in runs if o.get("shed_sent_late_p99_ms") is not None]
    if late:  # of the 429 p99: how late the client sent, and the rest
        f["429 p99: client late ms"] = Spread.of(late, "ms")
        f["429 p99 after send ms"] = Spread.of(
            [o["shed_after_send_p99_ms"] for o in runs if o.get("shed_after_send_p99_ms")], "ms"
        )
    loops = [o["event_loop"] for o in runs if o.get("event_loop")]
    if loops:  # the event loop's thread during the load: running, or ready and waiting
        f["loop ran"] = Spread.of([x["ran"] for x in loops], "")
        f["loop waited for a core"] = Spread.of([x["waited"] for x in loops], "")
    f["client CPU µs per request"] = Spread.of(
        [o.get("client_cpu_s", 0.0) / max(1, o["offered"]) * 1e6 for o in runs], "µs"
    )
    if all("sockets" in o for o in runs):
        f["unread in sockets (mean)"] = Spread.of(
            [o["sockets"]["unread_requests_mean"] for o in runs], "req"
        )
        f["socket wait ms (mean)"] = Spread.of(
            [o["sockets"]["unread_requests_mean"] / (o["offered"] / o["seconds"]) * 1000
             for o in runs], "ms",
        )  # fmt: skip
        f["accept queue (peak)"] = Spread.of([o["sockets"]["accept_queue_peak"] for o in runs], "")
    row.ratios["goodput ÷ capacity"] = paired_ratios(
        [o["goodput"] for o in runs], [o["capacity_rps"] for o in runs]
    )
    row.ratios["200 p99 ÷ capacity p99"] = paired_ratios(
        [o["ok_p99_ms"] or float("inf") for o in runs], [o["capacity_p99_ms"] for o in runs]
    )
    row.ratios["after ÷ capacity"] = paired_ratios(
        [o["after_rps"] for o in runs], [o["capacity_rps"] for o in runs]
    )
    if front == "direct":
        row.ratios["r ÷ a"] = paired_ratios(
            [o["cpu_per_refusal_us"] for o in runs], [o["cpu_per_answer_us"] for o in runs]
        )
        row.ratios["bound: goodput ÷ capacity"] = Spread.of(
            [bound(m, o["cpu_per_refusal_us"] / o["cpu_per_answer_us"]) for o in runs], ""
        )
    if direct is not None:
        pairs = {
            "goodput ÷ direct": lambda o: o["goodput"],
            "answered req/s ÷ direct": _answered,
            "200 p99 ÷ direct": lambda o: o["ok_p99_ms"] or float("inf"),
            "429 p99 ÷ direct": lambda o: o["shed_p99_ms"] or float("nan"),
        }
        for name, figure in pairs.items():
            row.ratios[name] = paired_ratios([figure(o) for o in runs], [figure(o) for o in direct])
    if m == TARGET_MULTIPLIER:
        for subject, (op, value, label) in TARGETS.items():
            if subject in row.figures or subject in row.ratios:
                row.target(subject, op, value, label)  # type: ignore[arg-type]
    return row


BENCHMARK = Benchmark(
    name="overload",
    summary="goodput, 429 latency and recovery at 1x-3x capacity, open loop",
    columns=(
        "goodput ÷ capacity",
        "429 p99 ms",
        "200 p99 ÷ capacity p99",
        "recovery s",
        "RSS growth MiB",
        "req/s ÷ capacity",
        "descriptors held",
    ),
    run=run,
    sizes=Sizes(
        quick={
            "rounds": 1,
            "seconds": 2.0,
            "capacity_seconds": 1.0,
            "probe_s": 1.0,
            "multipliers": (TARGET_MULTIPLIER,),
            "fronts": ("direct", "haproxy"),
            "runtimes": ("auto", "keras"),
            "slow_clients": 200,
            "connections": 256,
            "refusal_seconds": 1.0,
        },
        full={
            "rounds": 2,
            "seconds": 20.0,
            "capacity_seconds": 5.0,
            "probe_s": 3.0,
            "multipliers": (1, 2, 3),
            "fronts": ("direct", "haproxy"),
            "runtimes": ("auto", "keras"),
            "slow_clients": SLOW_CLIENTS,
            "connections": 512,
            "refusal_seconds": 5.0,
        },
    ),
    explained_always=True,
)
