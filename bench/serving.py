"""Benchmark 3, serving: requests/s and latency under concurrent clients, against the peers.

Five servers run at once on loopback, each in its own process with one uvicorn worker (uvloop
and httptools), serving the same Keras model built from the same seed; before measuring, each
must answer the bench's request with the same prediction as livefit (checked to 1e-5). The load
comes from a separate process (``wrk`` when installed, else ``bench.loadgen``): N keep-alive
connections, closed loop, the same one-row TF Serving body, a fixed duration. Each round runs
every server at every client count, the servers' order rotated; a ratio pairs the runs of one
round. Ratios are livefit's requests/s over the peer's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.load import LoadResult, run_load
from bench.models import LSTM, MLP, ModelSpec
from bench.procs import http_server, running, start_all, wait_all
from livefit.local_servers import HttpProcess
from livefit.server.config.model_tables import ServeSettings
from livefit.server.runtime.local_process import free_port

_SERVE_DEFAULTS = ServeSettings()
# livefit's serve defaults, given to LitServe too
MAX_BATCH, TIMEOUT_MS = _SERVE_DEFAULTS.max_batch_size, _SERVE_DEFAULTS.batch_timeout_ms
TARGETS = {"predict_on_batch": 2.0, "predict": 10.0, "litserve": 1.2, "constant": 0.7}
BEFORE = "livefit_keras"  # the side served by the runtime of before, in livefit's own process
TARGET_CLIENTS, TARGET_MODEL = 64, "mlp"


@dataclass(frozen=True, slots=True)
class Side:
    key: str
    label: str
    how: str


SIDES = (
    Side(
        "livefit",
        "livefit",
        f"`livefit serve`, default settings: batches of up to "
        f"{MAX_BATCH} rows, {TIMEOUT_MS:g} ms batch timeout, `serve.runtime = "
        f'"{_SERVE_DEFAULTS.runtime}"` (NumPy for the MLP; XLA for the LSTM in the run of '
        "2026-11-26, whose `auto` took it then, keras since: docs/benchmarks/runtimes.md), TF "
        "Serving REST endpoint",
    ),
    Side(
        "livefit_keras",
        "livefit, keras runtime",
        "the same `livefit serve` process and settings, another model of the same network "
        'with `serve.runtime = "keras"` (the graph runtime every model had before: '
        "`tf.function` traced once, padded to powers of two): before and after side by side",
    ),
    Side(
        "predict_on_batch",
        "FastAPI + predict_on_batch",
        "`async def` endpoint: `await request.json()`, `model.predict_on_batch(x)` on the event "
        "loop, dict response (a `def` endpoint in FastAPI's thread pool measured slower here)",
    ),
    Side(
        "predict",
        "FastAPI + model.predict",
        "the same with `model.predict(x, verbose=0)`, the call Keras tutorials show",
    ),
    Side(
        "litserve",
        "LitServe",
        f"LitServe 0.2 (`pip install litserve`), `max_batch_size="
        f"{MAX_BATCH}`, `batch_timeout={TIMEOUT_MS / 1e3}`, `predict_on_batch` on the batch, "
        "`accelerator='cpu'`, 1 inference worker, 1 API server, `fast_queue=True` (ZeroMQ)",
    ),
    Side(
        "constant",
        "HTTP ceiling",
        "FastAPI endpoint on the same uvicorn stack that reads the "
        "body and returns a constant response of livefit's size: no parsing, no model",
    ),
)


def run(ctx: Context) -> BenchResult:
    sides = _available_sides()
    models = ctx.sizes["models"]
    clients = ctx.sizes["clients"]
    rounds = ctx.sizes["rounds"]
    duration = ctx.sizes["duration"]
    result = _result(ctx, sides, models)
    plan = Plan([s.key for s in sides], clients, rounds, duration)
    runs: dict[str, list[LoadResult]] = {}
    for spec in models:
        _serve_model(ctx, spec, plan, result, runs)
    for spec in models:
        for n in clients:
            for side in sides:
                result.rows.append(_row(spec, n, side, runs))
    result.extra["runs"] = {k: [r.to_json() for r in v] for k, v in runs.items()}
    _check_errors(result, runs)
    return result


@dataclass(frozen=True, slots=True)
class Plan:
    """Which servers run, at which client counts, how many rounds of how long."""

    sides: list[str]
    clients: list[int]
    rounds: int
    duration: float


def _check_errors(result: BenchResult, runs: dict[str, list[LoadResult]]) -> None:
    """livefit answered 200 up to a full batch of clients, and never broke a socket."""
    # Up to a full batch of concurrent clients, admission never refuses (serve.max_queue_wait_ms
    # applies to requests that cannot join the next batch); beyond, 429s are its design.
    within = [
        r
        for key, v in runs.items()
        if key.endswith("/livefit") and int(key.split("/")[1]) <= MAX_BATCH
        for r in v
    ]
    errors = sum(r.errors for r in within)
    result.check(
        f"livefit answered every request 200, with no socket error, at up to {MAX_BATCH} clients",
        errors == 0,
        f"{errors} errors",
    )
    mine = [r for key, v in runs.items() if key.endswith("/livefit") for r in v]
    broken = sum(r.socket_errors for r in mine)
    result.check("livefit: no socket error at any client count", broken == 0, f"{broken} errors")


def _result(ctx: Context, sides: list[Side], models: list[ModelSpec]) -> BenchResult:
    """The result, before any measurement: sides and settings."""
    clients, rounds, duration = ctx.sizes["clients"], ctx.sizes["rounds"], ctx.sizes["duration"]
    result = BenchResult(
        name="serving",
        title="Serving throughput and latency",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={s.label: s.how for s in sides},
        settings={
            "models": "; ".join(m.describe() for m in models),
            "request": "one row, TF Serving `instances` JSON",
            "clients": clients,
            "seconds per run": duration,
            "rounds": rounds,
            "load client": ctx.load_client,
        },
    )
    if len(sides) < len(SIDES):
        result.notes.append(
            "LitServe is not installed here (`pip install -e '.[bench]'`), so "
            "its comparison was not run."
        )
    return result


def _available_sides() -> tuple[Side, ...]:
    if importlib.util.find_spec("litserve") is None:
        return tuple(s for s in SIDES if s.key != "litserve")
    return SIDES


def _serve_model(
    ctx: Context,
    spec: ModelSpec,
    plan: Plan,
    result: BenchResult,
    runs: dict[str, list[LoadResult]],
) -> None:
    work = ctx.workdir / spec.name
    body = spec.request_body()
    peers = _peers(spec, work, plan.sides)
    ctx.step(f"{spec.name}: starting livefit and the peers")
    with running(*peers.values()):
        for key, peer in peers.items():
            if key != "constant":
                peer.start(ready_timeout_s=None)  # their imports overlap livefit's start
        with ctx.fleet(spec.name, f"{spec.name}_keras") as fleet:
            wait_all([p for k, p in peers.items() if k != "constant"])
            servers = {"livefit": fleet.learner, BEFORE: fleet.learner, **peers}
            _check_same_outputs(spec, servers, body, work, result)
            _measure(ctx, spec, servers, body, plan, runs)


def _measure(
    ctx: Context,
    spec: ModelSpec,
    servers: dict[str, HttpProcess],
    body: bytes,
    plan: Plan,
    runs: dict[str, list[LoadResult]],
) -> None:
    """Every round runs every server at every client count, in a rotated order."""
    load_dir = ctx.workdir / spec.name / "load"
    if not ctx.quick:  # first calls and connection setup are not measured
        for key, server in servers.items():
            run_load(ctx.load_client, server.url + _path(spec, key), body, 16, 1.0, load_dir)
    for r in range(plan.rounds):
        for i, n in enumerate(plan.clients):
            for key in rotate(plan.sides, r * len(plan.clients) + i):
                url = servers[key].url + _path(spec, key)
                load = run_load(ctx.load_client, url, body, n, plan.duration, load_dir)
                runs.setdefault(_key(spec.name, n, key), []).append(load)
                _settle(servers[key], spec, body, key)
                ctx.step(
                    f"round {r + 1}/{plan.rounds} {spec.name} {n:>3} clients {key:>16}: "
                    f"{load.rps:>7,.0f} req/s  p50 {load.p50_ms:7.2f} ms  "
                    f"p99 {load.p99_ms:7.2f} ms  errors {load.errors}"
                )


def _path(spec: ModelSpec, side: str) -> str:
    """The predict path of ``spec`` on ``side``'s server (the before side: its own model)."""
    if side == BEFORE:
        return f"/v1/models/{spec.name}_keras:predict"
    return spec.predict_path()


def _settle(server: HttpProcess, spec: ModelSpec, body: bytes, side: str) -> None:
    """Wait until ``server`` has answered what the load left queued (one request, in line).

    A server that takes requests one at a time (the FastAPI peers) still works through the
    requests of clients that went away; that work must not overlap the next server's run.
    """
    with contextlib.suppress(httpx.HTTPError):
        _post(server, _path(spec, side), body, timeout=60.0)


def _peers(spec: ModelSpec, work: Path, sides: list[str]) -> dict[str, HttpProcess]:
    servers: dict[str, HttpProcess] = {}
    for mode in ("predict_on_batch", "predict", "constant"):
        port = free_port()
        extra = ["--constant-file", str(work / "constant.json")] if mode == "constant" else []
        argv = [
            sys.executable,
            "-m",
            "bench.peers.fastapi_keras",
            "--mode",
            mode,
            *spec.cli_args(),
            "--port",
            str(port),
            *extra,
        ]
        servers[mode] = http_server(f"fastapi-{mode}", argv, work, port, "/health")
    if "litserve" in sides:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "bench.peers.litserve_keras",
            *spec.cli_args(),
            "--port",
            str(port),
            "--max-batch-size",
            str(MAX_BATCH),
            "--batch-timeout-ms",
            str(TIMEOUT_MS),
        ]
        servers["litserve"] = http_server("litserve", argv, work, port, "/health")
    return servers


def _post(server: HttpProcess, path: str, body: bytes, timeout: float = 30.0) -> bytes:
    response = httpx.post(
        server.url + path,
        content=body,
        headers={"content-type": "application/json"},
        timeout=timeout,
    )
    response.raise_for_status()
    return response.content


def _check_same_outputs(
    spec: ModelSpec, servers: dict[str, HttpProcess], body: bytes, work: Path, result: BenchResult
) -> None:
    """Every model server answers livefit's numbers; the constant one answers livefit's size."""
    answer = _post(servers["livefit"], spec.predict_path(), body)
    (work / "constant.json").write_bytes(answer)
    start_all([servers["constant"]])
    expected = np.asarray(json.loads(answer)["predictions"], dtype=np.float64)
    for key, server in servers.items():
        got = _post(server, _path(spec, key), body)
        if key == "constant":
            result.check(
                f"{spec.name}: the constant response has livefit's size",
                len(got) == len(answer),
                f"{len(got)} vs {len(answer)} bytes",
            )
            continue
        outputs = np.asarray(json.loads(got)["predictions"], dtype=np.float64)
        same = outputs.shape == expected.shape and np.allclose(outputs, expected, atol=1e-5)
        result.check(
            f"{spec.name}: {key} predicts what livefit predicts (same weights)",
            same,
            f"{outputs.ravel()[:3]} vs {expected.ravel()[:3]}",
        )


def _row(spec: ModelSpec, n: int, side: Side, runs: dict[str, list[LoadResult]]) -> Row:
    mine = runs[_key(spec.name, n, side.key)]
    row = Row(case={"model": spec.name, "clients": n, "server": side.label})
    # successful answers only: a 429 (livefit's admission, past a full batch of clients) is
    # not throughput
    row.figures["req/s"] = Spread.of([r.ok_rps for r in mine], "req/s")
    row.figures["p50 ms"] = Spread.of([r.p50_ms for r in mine], "ms")
    row.figures["p99 ms"] = Spread.of([r.p99_ms for r in mine], "ms")
    row.figures["errors"] = Spread.of([float(r.errors) for r in mine], "")
    if side.key != "livefit":
        livefit = runs[_key(spec.name, n, "livefit")]
        row.ratios["livefit ÷ this (req/s)"] = paired_ratios(
            [r.ok_rps for r in livefit], [r.ok_rps for r in mine]
        )
        if n == TARGET_CLIENTS and spec.name == TARGET_MODEL and side.key in TARGETS:
            goal = TARGETS[side.key]
            row.target("livefit ÷ this (req/s)", ">=", goal, f"livefit ≥ {goal:g}x")
    return row


def _key(model: str, clients: int, side: str) -> str:
    return f"{model}/{clients}/{side}"


def rotate(items: list[str], by: int) -> list[str]:
    k = by % len(items)
    return items[k:] + items[:k]


BENCHMARK = Benchmark(
    name="serving",
    summary="HTTP predictions vs FastAPI+Keras, LitServe and the HTTP ceiling",
    columns=(
        "req/s",
        "p50 ms",
        "p99 ms",
        "livefit ÷ this (req/s)",
    ),
    run=run,
    sizes=Sizes(
        quick={"models": [MLP], "clients": [TARGET_CLIENTS], "rounds": 1, "duration": 1.0},
        full={"models": [MLP, LSTM], "clients": [1, 16, 64, 256], "rounds": 2, "duration": 3.0},
    ),
)
