"""The guard without a reference set (its shadow side) on the learning benchmark's drifting
streams, through the real server: does it hold serving back through a real drift, and for how
many samples?

One bench fleet (mosquitto and ``livefit serve``) holds a model per drifting stream and model
seed, each the user's table (shapes and loss) with ``[guard] enabled = true`` and nothing else;
each stream is fed over MQTT as the learning benchmark feeds it (``server.feed``). Per model
the learner's own metrics say how often the guard held (``livefit_guard_holds_total``), how
many samples the trainer learned while it held (``livefit_guard_held_samples_total``: how far
serving lagged the trainer) and whether it still holds at the end.

``python -m bench.learning.guard [--quick] [--seeds N ...] [--json PATH]``: prints a table;
``--json`` writes the rows (``bench/results/guard_drift.json`` holds the committed run,
docs/benchmarks/guard.md says what it shows).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.learning.results import MODEL_SEEDS, QUICK_MODEL_SEEDS
from bench.learning.streams import METRIC, STREAMS, Stream, load_stream

DRIFTING = ("sea", "hyperplane", "friedman", "agrawal_abrupt", "agrawal_gradual", "rbf_drift")
QUICK = ("agrawal_abrupt",)


def model_name(stream: str, seed: int) -> str:
    return f"{stream}_guard_{seed}"


def tables(streams: dict[str, Stream], seeds: Sequence[int]) -> dict[str, dict[str, Any]]:
    """The user's table of each stream, the guard on, one model per model seed."""
    return {
        model_name(name, seed): {**stream.table(), "seed": seed, "guard": {"enabled": True}}
        for name, stream in streams.items()
        for seed in seeds
    }


def row(stream: Stream, seed: int, metrics: dict[str, float], score: float) -> dict[str, Any]:
    """One model's figures from the learner's metrics (``metric name -> value`` of its model)."""
    return {
        "stream": stream.spec.name,
        "seed": seed,
        "samples": int(stream.x.shape[0]),
        "metric": METRIC[stream.task],
        "score": score,
        "holds": int(metrics.get("livefit_guard_holds_total", 0.0)),
        "held_samples": int(metrics.get("livefit_guard_held_samples_total", 0.0)),
        "held_at_end": metrics.get("livefit_guard_held_version", -1.0) >= 0,
    }


def run(quick: bool, workdir: Path, seeds: Sequence[int] = ()) -> list[dict[str, Any]]:
    from bench.fleet import Fleet
    from bench.learning.server import feed

    names = QUICK if quick else DRIFTING
    seeds = tuple(seeds) or (QUICK_MODEL_SEEDS if quick else MODEL_SEEDS)
    streams = {name: load_stream(STREAMS[name]) for name in names}
    rows = []
    fleet = Fleet(workdir, tables(streams, seeds), tag="guard")
    try:
        fleet.start(ready_timeout_s=300)
        for name, stream in streams.items():
            for seed in seeds:
                model = model_name(name, seed)
                score = feed(fleet, model, stream)
                time.sleep(0.5)  # the guard scores the last batches on its own thread
                every = fleet.learner.metrics()
                mine = {n: v for (n, labels), v in every.items() if ("model", model) in labels}
                found = row(stream, seed, mine, score.value(METRIC[stream.task]))
                rows.append(found)
                print(summary(found), flush=True)
    finally:
        fleet.stop()
    return rows


def summary(r: dict[str, Any]) -> str:
    end = ", held at the end" if r["held_at_end"] else ""
    return (
        f"{r['stream']:<16} seed {r['seed']}: {r['metric']} {r['score']:.4f}, "
        f"{r['holds']} holds, {r['held_samples']} of {r['samples']} samples held{end}"
    )


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per stream: holds and held samples over its seeds."""
    lines = [
        "| stream | samples | seeds | holds (sum) | samples held (most of a seed) | held at end |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in dict.fromkeys(r["stream"] for r in rows):
        mine = [r for r in rows if r["stream"] == name]
        lines.append(
            f"| {name} | {mine[0]['samples']:,} | {len(mine)} | {sum(r['holds'] for r in mine)} "
            f"| {max(r['held_samples'] for r in mine):,} | "
            f"{sum(r['held_at_end'] for r in mine)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learning.guard", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one stream, two seeds")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--workdir", type=Path, help="the fleet's files (default: a temp dir)")
    parser.add_argument("--seeds", type=int, nargs="+", default=(), help="the model seeds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        rows = run(args.quick, args.workdir or Path(scratch), args.seeds)
    print(markdown(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
