"""Every benchmark of the suite, by name, in the order they run and are reported.

Each benchmark module declares its ``BENCHMARK`` (``bench.harness.Benchmark``: its run
function, its quick and full sizes, its section renderer); ``python -m bench`` runs these and
``bench.report`` renders them, so adding a benchmark is adding it here.
"""

from __future__ import annotations

from bench import (
    batching,
    delayed_labels,
    devices,
    freshness,
    ingestion,
    interference,
    learning,
    memory,
    overload,
    runtimes,
    serving,
    trainer,
    workers,
)
from bench.harness import Benchmark

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        trainer.BENCHMARK,
        devices.BENCHMARK,
        ingestion.BENCHMARK,
        runtimes.BENCHMARK,
        serving.BENCHMARK,
        workers.BENCHMARK,
        batching.BENCHMARK,
        overload.BENCHMARK,
        freshness.BENCHMARK,
        interference.BENCHMARK,
        memory.BENCHMARK,
        learning.BENCHMARK,
        delayed_labels.BENCHMARK,
    )
}
