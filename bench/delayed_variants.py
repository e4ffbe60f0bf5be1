"""Candidate settings for delayed labels, through the real server, beside the defaults.

    .venv/bin/python -m bench.delayed_variants --out rows.json [--streams led,phishing]
        [--variants defaults,window0] [--repeats 3] [--delays none,fixed]

The ``delayed_labels`` benchmark's protocol (a prediction request per sample at 200/s, each
label published its delay later, river's best under the same delay), with several settings
side by side in one learner: every stream, delay and variant is a model of its own, and the
repeats are interleaved so that a slow spell of the machine hits every variant. Rows are added
to the JSON list in ``--out`` (created if absent), each numbered by its ``run`` (one more than
the file's last), and a summary of this run per stream, delay and variant is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.delayed_labels import STREAM_NAMES, best_peer, delays_for, livefit_score, river_row
from bench.learning import DEFAULTS, REGRESSION, STREAMS, Case, Knobs, learning_fleet, load_stream

LABELS = {"ttl_s": 3600.0}  # as the delayed_labels benchmark sets it
# labels not lingering, and a snapshot handed to serving after every batch (a 5 ms interval)
FRESH = {"labels": {**LABELS, "batch_window_ms": 0.0}, "weights": {"serve_interval_s": 0.005}}
# name -> (extra sections of the model's table, knobs)
VARIANTS: dict[str, tuple[dict[str, Any], Knobs]] = {
    "defaults": ({}, DEFAULTS),
    # joined labels not lingering for a minibatch (labels.batch_window_ms = 0)
    "window0": ({"labels": {**LABELS, "batch_window_ms": 0.0}}, DEFAULTS),
    # that, and one gradient step a batch (train.steps_per_batch = 1)
    "window0_steps1": (
        {"labels": {**LABELS, "batch_window_ms": 0.0}},
        replace(DEFAULTS, steps_per_batch=1),
    ),
    # snapshots handed to the learner's serving every 0.02 s (weights.serve_interval_s 0.15)
    "serve20ms": ({"weights": {"serve_interval_s": 0.02}}, DEFAULTS),
    # the freshest served model the settings allow, and that with one gradient step a batch
    "fresh": (FRESH, DEFAULTS),
    "fresh_steps1": (FRESH, replace(DEFAULTS, steps_per_batch=1)),
}


def run(
    streams: list[str], variants: list[str], repeats: int, delays: list[str], workdir: Path
) -> list[dict[str, Any]]:
    """One row per stream, delay, variant and repeat."""
    loaded = {name: load_stream(STREAMS[name], None) for name in streams}
    plans = [
        (name, stream, delay)
        for name, stream in loaded.items()
        for delay in delays_for(len(stream))
        if delay.name in delays
    ]
    tables = {
        f"{name}@{v}": {**stream.table(), "labels": LABELS, **VARIANTS[v][0]}
        for name, stream in loaded.items()
        for v in variants
    }
    cases = [
        Case(f"{name}_{delay.name}_{v}_{r}", f"{name}@{v}", v, VARIANTS[v][1])
        for r in range(repeats)
        for name, _, delay in plans
        for v in variants
    ]
    peers = {(name, delay.name): river_row(stream, delay) for name, stream, delay in plans}
    rows: list[dict[str, Any]] = []
    with learning_fleet(workdir, cases, tables) as fleet:
        for r in range(repeats):
            for name, stream, delay in plans:
                best_name, best = best_peer(peers[(name, delay.name)])
                for v in variants:
                    model = f"{name}_{delay.name}_{v}_{r}"
                    score, _, seconds = livefit_score(
                        fleet, model, stream, delay.delays(len(stream))
                    )
                    rows.append({"stream": name, "delay": delay.name, "variant": v, "repeat": r,
                                 "livefit": score, "river_best": best, "river_best_name": best_name,
                                 "task": stream.task, "seconds": seconds})  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per stream and delay: each variant's median against river's best (accuracy points, or
    the MAE ratio), its runs beside it."""
    lines = []
    keys = sorted({(r["stream"], r["delay"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for stream, delay in keys:
        for v in dict.fromkeys(r["variant"] for r in rows):
            runs = [
                r for r in rows if (r["stream"], r["delay"], r["variant"]) == (stream, delay, v)
            ]
            if not runs:
                continue
            best, regression = runs[0]["river_best"], runs[0]["task"] == REGRESSION
            values = [
                r["livefit"] / best if regression else 100 * (r["livefit"] - best) for r in runs
            ]
            unit = "x river's best MAE" if regression else "points vs river's best"
            shown = "{:.3f}" if regression else "{:+.3f}"
            lines.append(f"{stream:10} {delay:6} {v:16} {shown.format(statistics.median(values))} "
                         f"{unit} (runs {', '.join(shown.format(x) for x in values)})")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", default=",".join(STREAM_NAMES))
    parser.add_argument("--variants", default="defaults,window0")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--delays", default="none,fixed,random")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    earlier = recorded(args.out)
    with tempfile.TemporaryDirectory(prefix="livefit-delayed-variants-") as workdir:
        rows = run(args.streams.split(","), variants, args.repeats, args.delays.split(","),
                   Path(workdir))  # fmt: skip
    args.out.write_text(json.dumps(numbered(earlier, rows), indent=1) + "\n")
    print("\n".join(summary(rows)))


def recorded(path: Path) -> list[dict[str, Any]]:
    """The rows of earlier runs in ``path`` (none if it does not exist); read before a run,
    so that a file that is not such a list stops it before it starts."""
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SystemExit(f"{path} is not a list of rows: not overwritten")
    return rows


def numbered(earlier: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``earlier`` then ``rows``, each of which numbered as the run after the last one."""
    run_number = max((int(r.get("run", 0)) for r in earlier), default=0) + 1
    return [*earlier, *({"run": run_number, **row} for row in rows)]


if __name__ == "__main__":
    main()
