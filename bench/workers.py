"""Benchmark, serving workers: ``livefit replica --workers N`` and the split learner
``livefit serve --workers N`` (N = 1, 2) against an HTTP ceiling with as many serving
processes; the learner in one process (``--workers 0``) beside them.

One learner (the shared fleet's, model ``mlp``) publishes its weights; replica groups follow
it, each group a parent that binds the port and supervises its workers
(``server/runtime/workers.py``). Each split learner (``server/runtime/learner_group.py``:
a training process and N serving processes fed over a local socket) and the one-process
learner run the same model on their own mosquitto and storage, idle (no samples arrive: what
is measured is the serving path). The ceiling is the serving benchmark's: a
FastAPI endpoint on the same uvicorn stack that reads the body and answers a constant response
of livefit's size, run as one or two processes sharing one socket the same way. The load is
the serving benchmark's (N keep-alive connections, closed loop, the one-row TF Serving body,
a fixed duration), each round running every server at each client count, the order rotated,
and a ratio pairing the runs of one round. The load generator runs on the same cores: on a
2-core machine two workers compete with it, which is part of what is measured.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from bench.fleet import Fleet
from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.load import LoadResult, run_load
from bench.models import MLP
from bench.procs import http_server, livefit_server, own_learner, running
from bench.serving import rotate
from livefit.local_servers import HttpProcess
from livefit.server.runtime.local_process import free_port

BEFORE_MODEL = "mlp_keras"  # the same network on the graph runtime every model had before #29
TARGETS = {64: 0.7, 1: 0.5}  # livefit ÷ ceiling (req/s) at this many clients (issue #18)


def run(ctx: Context) -> BenchResult:
    workers, clients = list(ctx.sizes["workers"]), list(ctx.sizes["clients"])
    rounds, duration = ctx.sizes["rounds"], ctx.sizes["duration"]
    result = BenchResult(
        name="workers",
        title="Serving workers: replica and learner --workers N against the HTTP ceiling",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={
            "livefit replica --workers N": "N serving processes behind one port, each a whole "
            "replica of the learner's mlp, default settings",
            "livefit replica --workers 1, keras runtime": "the same replica group answering "
            f'for {BEFORE_MODEL}, the same network with `serve.runtime = "keras"`: the runtime '
            "every model had before issue #29",
            "livefit serve --workers N": "the learner of the same mlp: N >= 1, a training "
            "process and N serving processes (unset: the default, 1 on 2 cores); 0, one "
            "process; idle",
            "HTTP ceiling, N processes": "constant response of livefit's size, FastAPI on the "
            "same uvicorn stack, N processes sharing one socket, no model",
        },
        settings={
            "model": MLP.describe(),
            "workers": workers,
            "clients": clients,
            "seconds per run": duration,
            "rounds": rounds,
            "load client": ctx.load_client,
        },
    )
    runs = _measure(ctx, workers, clients, rounds, duration)
    for n in clients:
        for w in workers:
            result.rows.append(_row(n, w, runs))
        if 1 in workers:
            result.rows.append(_row(n, 1, runs, "keras"))
        for w in (0, *workers):
            result.rows.append(_row(n, w, runs, "learner"))
    result.extra["runs"] = {k: [r.to_json() for r in v] for k, v in runs.items()}
    broken = sum(r.socket_errors for k, v in runs.items() if "livefit" in k for r in v)
    result.check("livefit: no socket error", broken == 0, f"{broken} errors")
    return result


def _measure(
    ctx: Context, workers: list[int], clients: list[int], rounds: int, duration: float
) -> dict[str, list[LoadResult]]:
    """Runs by ``"<clients>/<side>/<workers>"``."""
    body, path = MLP.request_body(), MLP.predict_path()
    runs: dict[str, list[LoadResult]] = {}
    with ctx.fleet("mlp", BEFORE_MODEL) as fleet, _servers(ctx, fleet, workers) as servers:
        urls = {key: server.url + path for key, server in servers.items()}
        if "livefit/1" in servers:  # the same replica group, the runtime of before #29
            urls["keras/1"] = servers["livefit/1"].url + f"/v1/models/{BEFORE_MODEL}:predict"
        for url in urls.values():  # first calls and connection setup are not measured
            run_load(ctx.load_client, url, body, 16, 0.5, ctx.workdir / "load")
        keys = list(urls)
        for r in range(rounds):
            for i, n in enumerate(clients):
                for key in rotate(keys, r * len(clients) + i):
                    url = urls[key]
                    load = run_load(ctx.load_client, url, body, n, duration, ctx.workdir / "load")
                    runs.setdefault(f"{n}/{key}", []).append(load)
                    ctx.step(
                        f"round {r + 1}/{rounds} {n:>3} clients {key:<10}: "
                        f"{load.ok_rps:>7,.0f} req/s  p50 {load.p50_ms:6.2f} ms  "
                        f"p99 {load.p99_ms:6.2f} ms  errors {load.errors}"
                    )
    return runs


@contextmanager
def _servers(ctx: Context, fleet: Fleet, workers: list[int]) -> Iterator[dict[str, HttpProcess]]:
    """A replica group, a split learner and a ceiling per worker count, and a one-process
    learner, started and ready; the ceilings answer the bytes livefit answers. A quick run
    takes its shared learners: the fleet's (one process) and the split one (1 worker)."""
    work = ctx.workdir / "workers"
    work.mkdir(parents=True, exist_ok=True)
    config = fleet.learner.config
    groups: dict[str, HttpProcess] = {}
    shared: dict[str, HttpProcess] = {}
    if ctx.shared is not None:
        shared = {"learner/0": fleet.learner, "learner/1": ctx.shared.split()[1]}
    brokers = []
    for w in workers:
        text = re.sub(r"(?m)^workers = \d+$", f"workers = {w}", config.read_text(), count=1)
        groups[f"livefit/{w}"] = livefit_server(f"replica-w{w}", text, work, command="replica")
    for w in (0, *workers):
        if f"learner/{w}" not in shared:
            broker, groups[f"learner/{w}"] = own_learner(
                config.read_text(), work, f"learner-w{w}", w
            )
            brokers.append(broker)
    ceilings: dict[str, HttpProcess] = {}
    for w in workers:
        port = free_port()
        argv = [sys.executable, "-m", "bench.peers.fastapi_keras", "--mode", "constant",
                *MLP.cli_args(), "--port", str(port), "--constant-file",
                str(work / "constant.json"), "--workers", str(w)]  # fmt: skip
        ceilings[f"ceiling/{w}"] = http_server(f"ceiling-w{w}", argv, work, port, "/health")
    ctx.step(f"starting replica groups and HTTP ceilings with {workers} workers")
    with running(*brokers, *groups.values(), *ceilings.values()):
        for broker in brokers:
            broker.start()
        for group in groups.values():
            group.start(ready_timeout_s=None)
        for group in groups.values():
            group.wait_ready(240)
        first = next(iter(groups.values()))
        answer = httpx.post(first.url + MLP.predict_path(), content=MLP.request_body(),
                            headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
        answer.raise_for_status()
        (work / "constant.json").write_bytes(answer.content)
        for ceiling in ceilings.values():
            ceiling.start(ready_timeout_s=120)
        yield {**groups, **shared, **ceilings}


def _row(n: int, w: int, runs: dict[str, list[LoadResult]], side: str = "livefit") -> Row:
    """``side`` ("livefit": the replica group, "learner": the split learner, 0 workers: the
    one-process learner) against the ceiling with as many serving processes."""
    mine, ceiling = runs[f"{n}/{side}/{w}"], runs[f"{n}/ceiling/{max(w, 1)}"]
    kind = {"livefit": "replica", "learner": "serve", "keras": "replica"}[side]
    command = f"{kind} --workers {w}"
    if side == "keras":
        command += ', serve.runtime "keras" (before #29)'
    row = Row(case={"clients": n, "command": command})
    row.figures["livefit req/s"] = Spread.of([r.ok_rps for r in mine], "req/s")
    row.figures["ceiling req/s"] = Spread.of([r.ok_rps for r in ceiling], "req/s")
    row.figures["livefit p50 ms"] = Spread.of([r.p50_ms for r in mine], "ms")
    row.figures["livefit p99 ms"] = Spread.of([r.p99_ms for r in mine], "ms")
    row.figures["livefit errors"] = Spread.of([float(r.errors) for r in mine], "")
    ratio = "livefit ÷ ceiling (req/s)"
    row.ratios[ratio] = paired_ratios([r.ok_rps for r in mine], [r.ok_rps for r in ceiling])
    if n in TARGETS and side != "keras":  # the side before #29 is there to compare with
        row.target(ratio, ">=", TARGETS[n], f"≥ {TARGETS[n]:g}x the ceiling at {n} clients")
    return row


BENCHMARK = Benchmark(
    name="workers",
    summary="replica and split learner --workers 1 and 2 against an HTTP ceiling",
    columns=(
        "livefit req/s",
        "ceiling req/s",
        "livefit p50 ms",
        "livefit ÷ ceiling (req/s)",
    ),
    run=run,
    sizes=Sizes(
        quick={"workers": (1,), "clients": [64], "rounds": 1, "duration": 1.0},
        full={"workers": (1, 2), "clients": [1, 64], "rounds": 3, "duration": 5.0},
    ),
)
