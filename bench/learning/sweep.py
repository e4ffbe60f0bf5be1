"""The defaults sweep: a staged grid of learning settings on the binary streams, in-process."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from bench.harness import prose
from bench.learning.inprocess import InProcess
from bench.learning.knobs import DEFAULTS, MODEL_SEED, PREVIOUS, RECOMMENDED, V01, Knobs
from bench.learning.peers import LR, logistic_regression, peer_score
from bench.learning.scores import Score
from bench.learning.streams import (
    QUICK_SAMPLES,
    STREAM_SEED,
    STREAMS,
    SWEEP_STREAMS,
    Stream,
    load_stream,
)

LEARNING_RATES = (0.001, 0.003, 0.01, 0.03, 0.1)
REPLAYS: dict[str, dict[str, Any]] = {
    "off": {"replay_capacity": 0},
    "reservoir": {"replay_capacity": 2000, "replay_mode": "reservoir", "replay_share": 0.5},
    "window": {"replay_capacity": 2000, "replay_mode": "window", "replay_share": 0.5},
}
# Model seed, and the generators' seed of the synthetic streams:
ROBUSTNESS_SEEDS = (1, 2, 3, 4, 5, 6)
# At livefit's default Page-Hinkley threshold (50) the detector stays silent on these streams,
# so reactions change nothing; at 20 it fires on SEA's concept switches (and a few times more).
SENSITIVE_DRIFT_THRESHOLD = 20.0


@dataclass(slots=True)
class SweepRow:
    """One setting of the sweep on every stream (in-process), and its margins over LR."""

    stage: str
    knobs: Knobs
    stream_seed: int
    scores: dict[str, Score]
    margins: dict[str, float]  # accuracy minus logistic regression's on the same samples

    @property
    def worst(self) -> float:
        return min(self.margins.values())

    @property
    def mean(self) -> float:
        return statistics.fmean(self.margins.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "label": self.knobs.label(),
            "settings": self.knobs.resolved(),
            "seed": self.knobs.seed,
            "stream_seed": self.stream_seed,
            "streams": {k: v.to_json() for k, v in self.scores.items()},
            "margin_to_lr": self.margins,
            "worst_margin": self.worst,
            "mean_margin": self.mean,
        }


class Sweep:
    """A staged grid on the binary streams, in this process; each stage starts from the best
    settings so far.

    1. builder, optimizer and learning rate (1 step, no replay);
    2. steps per batch and replay, for the best two MLP settings of stage 1;
    3. for the best so far: drift reactions (with a detector sensitive enough to fire), tanh
       hidden units, narrower and wider hidden layers, learning rates between the grid's 0.01
       and 0.03, and no scaling (also for 0.1's defaults, to show what scaling is worth); and
       around the recommended settings, relu or tanh with recent windows of 500, 1000 or 2000
       samples replayed at shares 0.5 or 0.75;
    4. robustness: the best, the recommended, the previous and 0.1's settings again with
       other seeds (model initialisation and, for the synthetic streams, the generators).

    "Best": the largest worst-stream margin over logistic regression, then the largest mean.
    """

    def __init__(
        self,
        streams: dict[str, Stream],
        peers: dict[str, dict[str, Score]],
        log: Callable[[str], None],
        quick: bool = False,
        cache: InProcess | None = None,
    ) -> None:
        self.log = log
        self.quick = quick
        self.limit = QUICK_SAMPLES if quick else None
        self.cache = cache or InProcess()
        streams = {name: streams[name] for name in SWEEP_STREAMS}
        self._streams = {STREAM_SEED: streams}
        self._lr = {STREAM_SEED: {name: peers[name][LR].accuracy for name in SWEEP_STREAMS}}
        self.rows: list[SweepRow] = []
        self._seen: dict[tuple[str, int], SweepRow] = {}

    def measure(self, stage: str, knobs: Knobs, stream_seed: int = STREAM_SEED) -> SweepRow:
        """Run ``knobs`` on every stream (once: a repeat returns the row already measured)."""
        key = (knobs.key(), stream_seed)
        if key in self._seen:  # measured already: it counts for this stage too
            row = self._seen[key]
            if stage not in row.stage.split(", "):
                row.stage += f", {stage}"
            return row
        streams, lr = self._at(stream_seed)
        scores = {name: self.cache.score(s, knobs) for name, s in streams.items()}
        margins = {name: sc.accuracy - lr[name] for name, sc in scores.items()}
        row = self._seen[key] = SweepRow(stage, knobs, stream_seed, scores, margins)
        self.rows.append(row)
        figures = "  ".join(f"{n} {sc.accuracy:.4f}" for n, sc in scores.items())
        self.log(
            f"sweep {stage:<10} {knobs.label():<58} seed {knobs.seed:<2} {figures}  "
            f"worst {100 * row.worst:+.2f} pts"
        )
        return row

    def _at(self, seed: int) -> tuple[dict[str, Stream], dict[str, float]]:
        """The streams generated with ``seed`` and logistic regression's accuracy on them."""
        if seed not in self._streams:
            self._streams[seed] = {
                name: load_stream(STREAMS[name], self.limit, seed) for name in SWEEP_STREAMS
            }
            self._lr[seed] = {
                name: peer_score(logistic_regression, s).accuracy
                for name, s in self._streams[seed].items()
            }
        return self._streams[seed], self._lr[seed]

    def run(self) -> SweepRow:
        """Every stage; returns the best row (quick: two settings only, to check the code:
        the defaults, which the benchmark has measured on these samples already, and the
        recommended settings)."""
        if self.quick:
            return self.best([self.measure("quick", k) for k in (DEFAULTS, RECOMMENDED)])
        leaders = self._stage_optimizers()
        best = self._stage_updates(leaders)
        best = self._stage_extras(best)
        self._stage_seeds(best)
        return best

    def _stage_optimizers(self) -> list[SweepRow]:
        grid = [("mlp", o) for o in ("adam", "nadam", "sgd")] + [
            ("linear", o) for o in ("adam", "sgd")
        ]
        rows = [
            self.measure(
                "1 optimizer",
                replace(V01, builder=b, activation=None if b == "linear" else "relu",
                        optimizer=o, learning_rate=lr),
            )
            for b, o in grid
            for lr in LEARNING_RATES
        ]  # fmt: skip
        return sorted((r for r in rows if r.knobs.builder == "mlp"), key=_rank)[:2]

    def _stage_updates(self, leaders: list[SweepRow]) -> SweepRow:
        rows = [
            self.measure("2 updates", replace(r.knobs, steps_per_batch=steps, **replay))
            for r in leaders
            for steps in (1, 2, 4)
            for replay in REPLAYS.values()
        ]
        return self.best(rows)

    def _stage_extras(self, best: SweepRow) -> SweepRow:
        rows = [best]
        for reaction in ("reset_optimizer", "boost_lr"):
            knobs = replace(
                best.knobs, drift_reaction=reaction, drift_threshold=SENSITIVE_DRIFT_THRESHOLD
            )
            rows.append(self.measure("3 drift", knobs))
        rows.append(self.measure("3 tanh", replace(best.knobs, activation="tanh")))
        for units in ((32,), (16, 16), (128, 128)):
            rows.append(self.measure("3 width", replace(best.knobs, hidden_units=units)))
        for lr in (0.015, 0.02):
            rows.append(self.measure("3 rate", replace(best.knobs, learning_rate=lr)))
        for activation, capacity, share in itertools.product(
            ("relu", "tanh"), (500, 1000, 2000), (0.5, 0.75)
        ):
            knobs = replace(RECOMMENDED, activation=activation, replay_capacity=capacity,
                            replay_share=share)  # fmt: skip
            rows.append(self.measure("3 window", knobs))
        self.measure("3 scaling", replace(best.knobs, scaling="none"))
        self.measure("3 scaling", replace(V01, scaling="none"))
        return self.best(rows)

    def _stage_seeds(self, best: SweepRow) -> None:
        candidates = {k.key(): k for k in (best.knobs, RECOMMENDED, PREVIOUS, V01)}
        for knobs in candidates.values():
            for seed in ROBUSTNESS_SEEDS:
                self.measure("4 seeds", replace(knobs, seed=seed), stream_seed=seed)

    @staticmethod
    def best(rows: Iterable[SweepRow]) -> SweepRow:
        return sorted(rows, key=_rank)[0]

    def to_json(self, best: SweepRow) -> dict[str, Any]:
        return {
            "criterion": "the largest worst-stream accuracy margin over logistic regression, "
            "then the largest mean margin",
            "why_recommended": prose("learning-recommended").replace("\n", " "),
            "best": best.knobs.label(),
            "best_settings": best.knobs.resolved(),
            "recommended": RECOMMENDED.label(),
            "recommended_settings": RECOMMENDED.resolved(),
            "seeds": self._seed_summary(),
            "rows": [r.to_json() for r in self.rows],
        }

    def _seed_summary(self) -> list[dict[str, Any]]:
        """Per setting measured with several seeds: its accuracy range and worst margin."""
        groups: dict[str, list[SweepRow]] = {}
        for row in self.rows:
            groups.setdefault(replace(row.knobs, seed=MODEL_SEED).key(), []).append(row)
        summary = []
        for rows in groups.values():
            if len(rows) < 2:
                continue
            per_stream = {
                name: {
                    "min": min(r.scores[name].accuracy for r in rows),
                    "max": max(r.scores[name].accuracy for r in rows),
                    "mean_margin": statistics.fmean(r.margins[name] for r in rows),
                    "worst_margin": min(r.margins[name] for r in rows),
                }
                for name in SWEEP_STREAMS
            }
            summary.append(
                {
                    "label": rows[0].knobs.label(),
                    "seeds": [[r.knobs.seed, r.stream_seed] for r in rows],
                    "streams": per_stream,
                    "worst_margin": min(r.worst for r in rows),
                }
            )
        return summary


def _rank(row: SweepRow) -> tuple[float, float]:
    return (-round(row.worst, 4), -row.mean)
