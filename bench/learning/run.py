"""The learning benchmark, start to end: streams, peers, the server, in-process seeds and the
sweep; ``python -m bench.learning [--quick] [--sweep]`` runs it alone."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness import REPO, Benchmark
from bench.learning.inprocess import InProcess
from bench.learning.knobs import BEFORE_RECOVERY, DEFAULTS
from bench.learning.peers import peer_scores
from bench.learning.protocol import batch_scores
from bench.learning.recovery import after_drift, recovery_samples
from bench.learning.report import markdown, section, table
from bench.learning.results import (
    MODEL_SEEDS,
    QUICK_MODEL_SEEDS,
    results_of,
    to_bench_result,
    verdict,
)
from bench.learning.scores import Score, segment_edges, segments
from bench.learning.server import Case, server_cases, through_server
from bench.learning.streams import (
    DRIFTS,
    METRIC,
    QUICK_SAMPLES,
    QUICK_STREAMS,
    REGRESSION,
    STREAMS,
    Stream,
    load_stream,
)
from bench.learning.sweep import Sweep
from bench.learning.tables import fig, pct, short

if TYPE_CHECKING:
    from bench.harness import BenchResult, Context


def run(
    quick: bool = False,
    sweep: bool = False,
    workdir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure livefit and the peers on every stream; with ``sweep``, the defaults sweep too.

    Returns plain JSON (see ``markdown``). ``quick``: the first ``QUICK_SAMPLES`` of each of
    ``QUICK_STREAMS``, livefit at its defaults only, two model seeds (and in the sweep one
    setting beside the defaults): checks the harness works, not the quality.
    """
    log = log or _print
    started = time.perf_counter()
    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="livefit-learning-")) if workdir is None else workdir
    try:
        streams = {
            name: load_stream(STREAMS[name], QUICK_SAMPLES if quick else None)
            for name in (QUICK_STREAMS if quick else STREAMS)
        }
        peers = {name: peer_scores(s) for name, s in streams.items()}
        in_batches = {name: batch_scores(s) for name, s in streams.items()}
        for name, p in peers.items():
            metric = METRIC[streams[name].task]
            log(
                f"peers  {name:<10} "
                + "  ".join(f"{k} {v.value(metric):.4f}" for k, v in p.items())
                + "; in the server's protocol "
                + "  ".join(f"{k} {v:.4f}" for k, v in in_batches[name].items())
            )
        cases = server_cases(quick)
        served = through_server(streams, cases, workdir / "server", log)
        results = results_of(quick, streams, peers, cases, served, in_batches)
        cache = InProcess()
        results["agreement"] = _agreement(cache, streams, cases, served)
        _add_segments(results, cache, streams, cases, peers)
        seeds_started = time.perf_counter()
        seeds = QUICK_MODEL_SEEDS if quick else MODEL_SEEDS
        _add_seeds(results, cache, streams, seeds, log, before=not quick)
        results["seeds_seconds"] = round(time.perf_counter() - seeds_started, 1)
        if sweep:
            sweep_started = time.perf_counter()
            grid = Sweep(streams, peers, log, quick=quick, cache=cache)
            results["sweep"] = grid.to_json(grid.run())
            results["sweep"]["seconds"] = round(time.perf_counter() - sweep_started, 1)
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def _agreement(
    cache: InProcess, streams: dict[str, Stream], cases: Sequence[Case], served: dict[str, Score]
) -> list[dict[str, Any]]:
    """The server's figures next to in-process ones for the same settings and samples."""
    rows = []
    for case in cases:
        stream = streams[case.stream]
        metric = METRIC[stream.task]
        inproc = cache.score(stream, case.knobs).value(metric)
        server = served[case.model]
        rows.append(
            {
                "stream": case.stream,
                "side": case.side,
                "metric": metric,
                "server": server.value(metric),
                "in_process": inproc,
                "difference": server.value(metric) - inproc,
                "server_mean_batch_size": server.extra.get("mean_batch_size"),
            }
        )
    return rows


def _add_segments(
    results: dict[str, Any],
    cache: InProcess,
    streams: dict[str, Stream],
    cases: Sequence[Case],
    peers: dict[str, dict[str, Score]],
) -> None:
    """Figures over each stream's course (where livefit gains or loses against the peers), and
    for regression the MAE after the first message of every side."""
    for name, stream in results["streams"].items():
        edges = segment_edges(stream["samples"])
        sides, after_first, per_sample = {}, {}, {}
        for case in (c for c in cases if c.stream == name):
            score = cache.score(streams[name], case.knobs)
            assert score.per_sample is not None
            sides[f"livefit ({case.side})"] = segments(score.per_sample, edges)
            after_first[f"livefit ({case.side})"] = score.mae_after_first_message
            per_sample[f"livefit ({case.side})"] = score.per_sample
        for peer, score in peers[name].items():
            assert score.per_sample is not None
            sides[peer] = segments(score.per_sample, edges)
            after_first[peer] = score.mae_after_first_message
            per_sample[peer] = score.per_sample
        stream["segments"] = {"edges": edges, "sides": sides}
        stream["first_500"] = {side: float(np.mean(per[:500])) for side, per in per_sample.items()}
        drifts = [d for d in DRIFTS.get(name, ()) if d < stream["samples"]]
        if drifts:
            higher = stream["metric"] == "accuracy"
            stream["recovery"] = {
                "drifts": drifts,
                "sides": {
                    side: {
                        "samples": [recovery_samples(per, d, higher) for d in drifts],
                        "after_1000": [after_drift(per, d) for d in drifts],
                    }
                    for side, per in per_sample.items()
                },
            }
        if stream["task"] == REGRESSION:
            stream["after_first_message"] = after_first


def _add_seeds(
    results: dict[str, Any],
    cache: InProcess,
    streams: dict[str, Stream],
    seeds: Sequence[int],
    log: Callable[[str], None],
    before: bool = True,
) -> None:
    """The user's configuration with every model seed in ``seeds``, in-process: mean, worst,
    and on how many seeds livefit is at least as good as the per-sample linear model; with
    ``before``, the same for the defaults before #30 on the same seeds."""
    for name, stream in streams.items():
        metric = METRIC[stream.task]
        higher = metric == "accuracy"
        scores = [cache.score(stream, replace(DEFAULTS, seed=seed)) for seed in seeds]
        values = [s.value(metric) for s in scores]
        old = [
            cache.score(stream, replace(BEFORE_RECOVERY, seed=seed)).value(metric)
            for seed in (seeds if before else ())
        ]
        r = results["streams"][name]
        reference = r["peers"][r["reference"]][metric]
        entry: dict[str, Any] = {
            "seeds": list(seeds),
            "values": values,
            "mean": statistics.fmean(values),
            "worst": min(values) if higher else max(values),
            "best": max(values) if higher else min(values),
            "at_least_reference": sum(
                (v >= reference) if higher else (v <= reference) for v in values
            ),
        }
        if old:
            entry["before"] = {
                "values": old,
                "mean": statistics.fmean(old),
                "worst": min(old) if higher else max(old),
            }
        if stream.task == REGRESSION:
            after = [s.mae_after_first_message for s in scores]
            entry["after_first_message"] = {"values": after, "mean": statistics.fmean(after)}
        r["seeds"] = entry
        r["pass"] = verdict(r)
        log(
            f"seeds  {name:<10} {metric} mean {entry['mean']:.4f} worst {entry['worst']:.4f} "
            f"over {len(values)} seeds (reference {r['reference']} {reference:.4f})"
        )


def write(results: dict[str, Any], json_path: Path, md_path: Path) -> None:
    """The results as JSON at ``json_path`` and the Markdown section at ``md_path``."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1, allow_nan=True) + "\n")
    md_path.write_text(markdown(results))


def suite_run(ctx: Context) -> BenchResult:
    """This benchmark for ``python -m bench`` (``bench.cli``): the same run, as a BenchResult."""
    results = run(quick=ctx.quick, sweep=True, workdir=ctx.workdir, log=ctx.step)
    return to_bench_result(results)


def _print(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_SAMPLES} samples a stream: the harness"
    )
    parser.add_argument("--sweep", action="store_true", help="also the defaults sweep")
    parser.add_argument("--json", metavar="PATH", help="results (default bench/results/...)")
    parser.add_argument("--markdown", metavar="PATH", help="Markdown section to write")
    args = parser.parse_args(argv)
    stem = "learning-quick" if args.quick else "learning"
    json_path = Path(args.json or REPO / "bench" / "results" / f"{stem}.json")
    md_path = Path(args.markdown or json_path.with_suffix(".md"))
    results = run(quick=args.quick, sweep=args.sweep)
    write(results, json_path, md_path)
    _print(f"wrote {json_path} and {md_path} ({results['seconds']:.0f} s)")
    for r in results["streams"].values():
        metric = r["metric"]
        shown = pct if metric == "accuracy" else fig
        judged = "" if r["pass"] is None else ("pass" if r["pass"] else "MISS")
        best = r.get("best_in_batches") or r["best_per_sample"]
        seeds = r.get("seeds") or {"mean": math.nan, "worst": math.nan}
        _print(
            f"{r['title']:<40} livefit {shown(seeds['mean'])} (worst {shown(seeds['worst'])})  "
            f"river's best {shown(best['value'])} ({short(best['peer'])})  {judged}"
        )
    return 0


BENCHMARK = Benchmark(
    name="learning",
    summary="prequential accuracy through the server vs river's per-sample learners",
    run=suite_run,
    table=table,
    section=section,
)
