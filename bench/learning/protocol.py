"""river's peers scored the way livefit's server is fed: how much of the learning benchmark's
gap is the scoring protocol rather than the learner.

    .venv/bin/python -m bench.learning.protocol [--streams trump,waveform] [--limit N]
        [--livefit bench/results/fast_start_after_first.jsonl] [--out bench/results/protocol.json]

The learning benchmark scores river sample by sample (``evaluate.progressive_val_score``'s order):
each sample is predicted by a model that has learned every sample before it. livefit's server
cannot do that within a message: a message of 25 labelled samples arrives at once, its
samples were predicted (and the clients answered) before any of their labels came, and the
trainer scores each minibatch with the version before it. So this module scores each river
peer three ways on the same rows:

- ``per_sample``: river's own protocol (the learning benchmark's figures);
- ``livefit_batches``: each peer predicts a whole minibatch, then learns its samples one by
  one, with the minibatches livefit's trainer takes from messages of 25 at the defaults
  (``batch_schedule``: for a regression loss the fast start's 5, 5, 10, 5, then whole
  messages; for the others whole messages from the first);
- ``chunks``: the same with whole messages from the first (livefit without a fast start).

Beside them, livefit's in-process figure at the defaults (the mean over model seeds of the
``defaults`` rows in ``--livefit``, ``bench.learning.variants``' output: by default the rows
measured with today's defaults, a regression model's fast start only), so the table reads
"livefit against river's best, in river's protocol and in livefit's".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.learning.peers import PEERS, contender_kind
from bench.learning.streams import CHUNK, METRIC, REGRESSION, STREAMS, Stream, load_stream

PROTOCOLS = ("per_sample", "livefit_batches", "chunks")


def batch_schedule(
    total: int, message: int, fast_start_samples: int, min_batch: int, max_batch: int
) -> Iterator[tuple[int, int]]:
    """The ``(start, stop)`` minibatches livefit's trainer takes from ``total`` samples that
    arrive in messages of ``message``, each message learned before the next arrives: a batch
    never spans two messages, and while fewer than ``fast_start_samples`` are learned it is
    no larger than the count learned so far and no smaller than ``min_batch``
    (``Trainer.batch_limit``)."""
    seen = 0
    for first in range(0, total, message):
        last = min(first + message, total)
        start = first
        while start < last:
            limit = max_batch
            if seen < fast_start_samples:
                limit = min(max_batch, max(min_batch, seen))
            stop = min(last, start + limit)
            yield start, stop
            seen += stop - start
            start = stop


def livefit_schedule(total: int, task: str, message: int = CHUNK) -> list[tuple[int, int]]:
    """:func:`batch_schedule` at livefit's defaults for ``task``'s loss, read from the server's
    own settings (the fast start is on for regression losses only)."""
    from livefit.server.config.model import ModelSettings
    from livefit.server.train.trainer import FAST_START_MIN_BATCH

    loss = "mse" if task == REGRESSION else "binary_crossentropy"
    settings = ModelSettings.model_validate({"input_shape": [1], "output_shape": [1], "loss": loss})
    return list(
        batch_schedule(
            total, message, settings.resolved_fast_start_samples(), FAST_START_MIN_BATCH,
            settings.train.max_batch_size,
        )
    )  # fmt: skip


def score_in_batches(
    make_model: Callable[[], Any], stream: Stream, batches: list[tuple[int, int]]
) -> float:
    """Accuracy or MAE of a river model that predicts each batch whole, then learns it one
    sample at a time. One-sample batches give the learning benchmark's figure (no answer
    scored wrong, where ``progressive_val_score`` would leave it out)."""
    model = make_model()
    rows = list(stream.rows)
    scores = np.zeros(len(rows), dtype=np.float64)
    for start, stop in batches:
        part = rows[start:stop]
        for i, (x, y) in enumerate(part, start):
            if stream.task == REGRESSION:
                scores[i] = abs(float(model.predict_one(x)) - y)
            else:
                proba = model.predict_proba_one(x)
                scores[i] = (max(proba, key=proba.get) if proba else None) == y
        for x, y in part:
            model.learn_one(x, y)
    return float(scores.mean())


def batch_scores(stream: Stream) -> dict[str, float]:
    """Every peer of ``stream``'s task in the server's protocol: each minibatch livefit's
    trainer would take predicted whole, then learned sample by sample (``livefit_schedule``)."""
    schedule = livefit_schedule(len(stream), stream.task)
    return {
        peer: score_in_batches(make, stream, schedule)
        for peer, (_, make) in PEERS[stream.task].items()
    }


def best_peer(values: dict[str, float], metric: str) -> dict[str, Any]:
    """The best of issue #30's three kinds of peer (linear, HAT, ARF) among ``values``:
    ``{"peer", "value"}``."""
    higher = metric == "accuracy"
    ranked = sorted(
        ((v, peer) for peer, v in values.items() if contender_kind(peer) and v == v),
        reverse=higher,
    )
    return {"peer": ranked[0][1], "value": ranked[0][0]}


def protocol_row(stream: Stream, name: str) -> dict[str, Any]:
    """Every peer of ``stream``'s task under each protocol, and the best of issue #30's."""
    schedules = {
        "per_sample": [(i, i + 1) for i in range(len(stream))],
        "livefit_batches": livefit_schedule(len(stream), stream.task),
        "chunks": [(i, min(i + CHUNK, len(stream))) for i in range(0, len(stream), CHUNK)],
    }
    peers: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    for peer, (_, make) in PEERS[stream.task].items():
        peers[peer] = {p: score_in_batches(make, stream, s) for p, s in schedules.items()}
    metric = METRIC[stream.task]
    best = {
        protocol: best_peer({peer: v[protocol] for peer, v in peers.items()}, metric)
        for protocol in PROTOCOLS
    }
    return {
        "stream": name,
        "metric": METRIC[stream.task],
        "samples": len(stream),
        "peers": peers,
        "best": best,
        "seconds": time.perf_counter() - started,
    }


def livefit_means(path: Path, variant: str = "defaults") -> dict[str, dict[str, float]]:
    """Per stream: the mean and worst over seeds of ``variant``'s rows in a variants file."""
    values: dict[str, list[float]] = {}
    metric: dict[str, str] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["variant"] == variant:
            values.setdefault(row["stream"], []).append(row["value"])
            metric[row["stream"]] = row["metric"]
    return {
        s: {
            "mean": statistics.fmean(v),
            "worst": min(v) if metric[s] == "accuracy" else max(v),
            "seeds": len(v),
        }
        for s, v in values.items()
    }


def _figure(value: float, accuracy: bool) -> str:
    return f"{100 * value:.2f} %" if accuracy else f"{value:.3f}"


def _gap(ours: float, theirs: float, accuracy: bool) -> str:
    """Accuracy points ahead (+) or behind; MAE as a ratio (below 1: livefit's is lower)."""
    return f"{100 * (ours - theirs):+.2f} pts" if accuracy else f"{ours / theirs:.2f}x"


def table(rows: list[dict[str, Any]], livefit: dict[str, dict[str, float]]) -> list[str]:
    """Markdown: livefit against river's best (linear, HAT, ARF) under each protocol."""
    lines = [
        "| stream | livefit, mean (worst seed) | river's best per sample | gap | "
        "in livefit's batches | gap | in messages of 25 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        accuracy = row["metric"] == "accuracy"
        best = row["best"]
        own = livefit.get(row["stream"])
        ours = "n/a"
        if own:
            ours = f"{_figure(own['mean'], accuracy)} ({_figure(own['worst'], accuracy)})"
        cells = [STREAMS[row["stream"]].title, ours]
        for protocol in PROTOCOLS:
            b = best[protocol]
            cells.append(f"{_figure(b['value'], accuracy)} ({b['peer']})")
            if protocol != "chunks":
                cells.append(_gap(own["mean"], b["value"], accuracy) if own else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default=",".join(STREAMS))
    parser.add_argument("--limit", type=int, default=None, help="samples per stream")
    parser.add_argument("--livefit", default="bench/results/fast_start_after_first.jsonl")
    parser.add_argument("--out", default=None, help="write the rows here (JSON)")
    parser.add_argument("--table", default=None, help="print the table of these rows instead")
    args = parser.parse_args(argv)
    livefit = livefit_means(Path(args.livefit)) if Path(args.livefit).exists() else {}
    if args.table:
        rows = json.loads(Path(args.table).read_text())["rows"]
    else:
        rows = []
        for name in args.streams.split(","):
            rows.append(protocol_row(load_stream(STREAMS[name], args.limit), name))
            print(f"{name}: {rows[-1]['best']} ({rows[-1]['seconds']:.0f} s)", file=sys.stderr)
        if args.out:
            Path(args.out).write_text(json.dumps({"limit": args.limit, "rows": rows}, indent=1))
    print("\n".join(table(rows, livefit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
