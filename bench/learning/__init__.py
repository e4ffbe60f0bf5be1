"""Learning quality: prequential scores through the real server, against per-sample learners.

``streams`` (river's datasets and generators) and ``peers`` (river's per-sample learners) are
what livefit is measured on and against; ``knobs`` are the settings under test; ``server`` runs
livefit in a bench fleet (``bench.fleet``), ``inprocess`` runs the server's trainer without
MQTT; ``sweep`` searches the defaults; ``run`` is the benchmark start to end, ``results`` its
JSON and BenchResult, ``report`` and ``tables`` its Markdown section. Findings written by hand
live in ``docs/benchmarks/learning*.md``.
"""

from bench.learning.knobs import DEFAULTS, MODEL_SEED, Knobs, describe
from bench.learning.peers import ARF, HAT, HT, LINREG, LINREG_TSS, LR, PEERS, REFERENCE, SOFTMAX
from bench.learning.report import markdown, section
from bench.learning.results import QUICK_MODEL_SEEDS, to_bench_result
from bench.learning.run import BENCHMARK, main, run, suite_run, write
from bench.learning.server import Case, feed, learning_fleet, model_tables, server_cases
from bench.learning.streams import (
    BINARY,
    BINARY_STREAMS,
    MULTICLASS,
    QUICK_SAMPLES,
    QUICK_STREAMS,
    REGRESSION,
    STREAMS,
    SWEEP_STREAMS,
    Stream,
    load_stream,
)

__all__ = [
    "ARF",
    "BENCHMARK",
    "BINARY",
    "BINARY_STREAMS",
    "DEFAULTS",
    "HAT",
    "HT",
    "LINREG",
    "LINREG_TSS",
    "LR",
    "MODEL_SEED",
    "MULTICLASS",
    "PEERS",
    "QUICK_MODEL_SEEDS",
    "QUICK_SAMPLES",
    "QUICK_STREAMS",
    "REFERENCE",
    "REGRESSION",
    "SOFTMAX",
    "STREAMS",
    "SWEEP_STREAMS",
    "Case",
    "Knobs",
    "Stream",
    "describe",
    "feed",
    "learning_fleet",
    "load_stream",
    "main",
    "markdown",
    "model_tables",
    "run",
    "section",
    "server_cases",
    "suite_run",
    "to_bench_result",
    "write",
]
