"""Online model selection on the learning benchmark's streams: selection off against on, in
process (the trainer's own code path, ``inprocess.learn_inprocess``), over model seeds, with
the cost in samples/s measured side by side (off and on alternate, in interleaved rounds).

    .venv/bin/python -m bench.learning.selection [--seeds 1,2] [--streams waveform,led]
        [--limit N] [--out results.json]

The candidates beside the configured model (livefit's defaults): ``--candidates rates`` (the
default), the same network at a third and at three times the learning rate (``CANDIDATES``):
online selection may only vary what keeps the architecture (``[models.<name>.selection]``).
``--candidates sgd``: the same network with plain SGD at 0.1. ``--candidates linear``: one
linear model (``builder = "linear"``) beside the network, which the server refuses (a replica
builds one network from the config and could not serve the linear model's weights). Here, in
process, the bench gives the candidate its builder (``_linear_candidates``) to measure what
building that support would gain. ``--switching fast``: a window of 200 samples, a margin of
0.02 and 100 samples between switches instead of the settings' 500, 0.05 and 500.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.learning.inprocess import learn_inprocess
from bench.learning.knobs import Knobs
from bench.learning.streams import METRIC, STREAMS, load_stream

DEFAULT_LR = 0.01  # ModelSettings.learning_rate's default (checked in main)
CANDIDATES = (
    {"name": "lr_third", "learning_rate": DEFAULT_LR / 3},
    {"name": "lr_triple", "learning_rate": DEFAULT_LR * 3},
)
SELECTION = {"enabled": True, "candidates": list(CANDIDATES)}
LINEAR_CANDIDATE = "linear"
CANDIDATE_SETS = {
    "rates": SELECTION,
    "linear": {"enabled": True, "candidates": [{"name": LINEAR_CANDIDATE}]},
    # The same network with plain SGD at 0.1, which scores as river's softmax regression on
    # Waveform alone and falls apart on the drifting streams (variants "sgd01", 2026-11-27)
    "sgd": {"enabled": True, "candidates": [{"name": "sgd", "optimizer": "sgd",
                                             "learning_rate": 0.1}]},
}  # fmt: skip
# How fast the served candidate follows the windowed losses: the settings' defaults (a window
# of 500 samples, a margin of 0.05, 500 samples between switches), or a window of 200, a margin
# of 0.02 and 100 samples between switches (``--switching fast``; measured 2026-11-27, not
# adopted: BENCHMARKS.md, "Online model selection remeasured")
SWITCHING = {
    "default": {},
    "fast": {"window": 200, "margin": 0.02, "min_samples_between_switches": 100},
}


@contextlib.contextmanager
def _linear_candidates() -> Iterator[None]:
    """Within: candidate ``LINEAR_CANDIDATE`` is built as ``builder = "linear"`` (what
    ``[models.<name>.selection]`` refuses in a server; the trainer alone takes it)."""
    from livefit.server.config.model import ModelSettings

    original = ModelSettings.candidate_settings

    def candidate_settings(self: ModelSettings, name: str) -> ModelSettings:
        own = original(self, name)
        if name != LINEAR_CANDIDATE:
            return own
        return own.model_copy(update={"builder": "linear", "builder_options": {}})

    ModelSettings.candidate_settings = candidate_settings  # type: ignore[method-assign]
    try:
        yield
    finally:
        ModelSettings.candidate_settings = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class Selecting:
    """``knobs`` with a ``[models.<name>.selection]`` table (what ``learn_inprocess`` needs)."""

    knobs: Knobs
    selection: dict[str, Any] = field(default_factory=lambda: dict(SELECTION))

    def model_config(self, table: dict[str, Any]) -> dict[str, Any]:
        return {**self.knobs.model_config(table), "selection": self.selection}


def compare(
    streams: list[str],
    seeds: list[int],
    limit: int | None,
    candidates: str = "rates",
    switching: str = "default",
) -> dict[str, Any]:
    """Each stream and seed, off then on (on then off every other round), with the candidate
    set ``candidates`` names (``CANDIDATE_SETS``) and the switch settings ``switching``
    names (``SWITCHING``)."""
    selection = {**CANDIDATE_SETS[candidates], **SWITCHING[switching]}
    with _linear_candidates() if candidates == "linear" else contextlib.nullcontext():
        return _compare(streams, seeds, limit, selection)


def _compare(
    streams: list[str], seeds: list[int], limit: int | None, selection: dict[str, Any]
) -> dict[str, Any]:
    rows = []
    for name in streams:
        stream = load_stream(STREAMS[name], limit)
        metric = METRIC[stream.task]
        for i, seed in enumerate(seeds):
            knobs = Knobs(seed=seed)
            sides = [("off", knobs), ("on", Selecting(knobs, selection))]
            scores = {side: learn_inprocess(stream, k) for side, k in sides[:: 1 - 2 * (i % 2)]}
            off, on = scores["off"], scores["on"]
            row = {
                "stream": name, "seed": seed, "metric": metric,
                "off": off.value(metric), "on": on.value(metric),
                "off_samples_per_s": off.samples / off.seconds,
                "on_samples_per_s": on.samples / on.seconds,
                "switches": on.extra.get("switches"), "served": on.extra.get("served"),
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"rows": rows, "summary": summary(rows)}


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stream: the mean figure off and on, the gain (higher is better: accuracy points,
    or MAE lowered in %), and the samples/s ratio on / off."""
    out = []
    for name in dict.fromkeys(r["stream"] for r in rows):
        mine = [r for r in rows if r["stream"] == name]
        off = statistics.fmean(r["off"] for r in mine)
        on = statistics.fmean(r["on"] for r in mine)
        regression = mine[0]["metric"] != "accuracy"
        gain = 100 * (off - on) / off if regression else 100 * (on - off)
        speed = statistics.fmean(r["on_samples_per_s"] / r["off_samples_per_s"] for r in mine)
        out.append({
            "stream": name, "metric": mine[0]["metric"], "off": off, "on": on,
            "gain": gain, "gain_unit": "% MAE" if regression else "points",
            "speed_ratio": speed, "switches": sum(r["switches"] or 0 for r in mine),
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    from livefit.server.config.model import ModelSettings

    default = ModelSettings(input_shape=[1], output_shape=[1]).learning_rate
    assert default == DEFAULT_LR, f"update DEFAULT_LR: the default learning rate is {default}"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default=",".join(STREAMS))
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--limit", type=int, default=None, help="samples per stream")
    parser.add_argument("--candidates", choices=sorted(CANDIDATE_SETS), default="rates")
    parser.add_argument("--switching", choices=sorted(SWITCHING), default="default")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    result = compare(args.streams.split(","), seeds, args.limit, args.candidates, args.switching)
    result["candidates"] = args.candidates
    result["switching"] = args.switching
    for row in result["summary"]:
        print(
            f"{row['stream']:<12} {row['metric']:<8} off {row['off']:.4f} on {row['on']:.4f} "
            f"gain {row['gain']:+.2f} {row['gain_unit']}  samples/s on/off "
            f"{row['speed_ratio']:.2f}  switches {row['switches']}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
