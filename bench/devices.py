"""Benchmark: several devices, livefit's trainer on one device and mirrored on two.

In a child process whose CPU is split into two logical devices
(`tensorflow.logical_cpu_devices = 2`; TensorFlow accepts that only before it starts), the
same MLP as the trainer benchmark, a real `Trainer` with its `SampleQueue` pre-filled
with chunks of 100 samples, timed until every queued sample is trained: once on `/CPU:0`
alone and once under `MirroredStrategy` over `/CPU:0` and `/CPU:1`, in interleaved rounds
(order rotated). The two logical devices share the same cores, so no gain is expected here:
the figure is what the mirrored path costs (padding, slicing, the all-reduce of the
gradients, one update across both copies). On GPUs each device brings its own compute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread, paired_ratios
from bench.models import MLP

CHUNK = 100
SIDES = {
    "1 device": "`Trainer` on `/CPU:0` (today's placement), default settings, "
    "`train.max_batch_size` = the batch size, `max_wait_ms` = 0",
    "2 devices": 'the same `Trainer` with `tensorflow.devices = ["CPU:0", "CPU:1"]`: '
    "`MirroredStrategy` over two logical devices of the same CPU",
}


def run(ctx: Context) -> BenchResult:
    sizes = ctx.sizes
    result = BenchResult(
        name="devices",
        title="Several devices",
        what=__doc__.split("\n", 2)[2].strip(),
        sides=SIDES,
        settings={
            "model": MLP.describe(),
            "samples per chunk": CHUNK,
            "samples per measurement": sizes["samples"],
            "rounds": sizes["rounds"],
            "devices": "2 logical CPU devices of one CPU (no GPU)",
        },
    )
    ctx.step(f"devices: child process, {sizes['rounds']} rounds")
    done = subprocess.run(
        [sys.executable, "-m", "bench.devices", json.dumps(sizes)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"devices child failed:\n{done.stderr[-3000:]}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    for bs in sizes["batch_sizes"]:
        one, two = measured[str(bs)]["1"], measured[str(bs)]["2"]
        for devices, rates in (("1", one), ("2", two)):
            result.check(
                f"every sample trained once ({devices} device(s), batch {bs})",
                all(r["samples_seen"] == r["samples"] for r in rates),
                ", ".join(f"{r['samples_seen']} of {r['samples']}" for r in rates),
            )
        row = Row(case={"batch size": bs})
        row.figures["1 device samples/s"] = Spread.of([r["rate"] for r in one], "samples/s")
        row.figures["2 devices samples/s"] = Spread.of([r["rate"] for r in two], "samples/s")
        row.ratios["2 devices ÷ 1 device"] = paired_ratios(
            [r["rate"] for r in two], [r["rate"] for r in one]
        )
        row.target("2 devices ÷ 1 device", ">=", 0.5, "≥ 0.5x: the mirrored path costs little")
        result.rows.append(row)
        ctx.step(
            f"  batch {bs:>4}: 1 device {row.figures['1 device samples/s'].median:>9,.0f}/s  "
            f"2 devices {row.figures['2 devices samples/s'].median:>9,.0f}/s"
        )
    result.merge_checks()
    return result


def measure(sizes: dict[str, Any]) -> dict[str, dict[str, list[dict[str, float]]]]:
    """In this process (its CPU split in two before TensorFlow started): for each batch size,
    each placement's runs, interleaved round by round."""
    from bench.trainer import trainer_rate, training_data
    from livefit.server.train.placement import Placement

    placements = {"1": "/CPU:0", "2": Placement(["/CPU:0", "/CPU:1"])}
    x, y = training_data(MLP, n=sizes["samples"])
    out: dict[str, dict[str, list[dict[str, float]]]] = {}
    for bs in sizes["batch_sizes"]:
        runs: dict[str, list[dict[str, float]]] = {"1": [], "2": []}
        for r in range(sizes["rounds"]):
            for key in ["1", "2"] if r % 2 == 0 else ["2", "1"]:
                rate, checks = trainer_rate(MLP, x, y, bs, CHUNK, placements[key])
                runs[key].append({"rate": rate, "samples": len(x), **checks})
        out[str(bs)] = runs
    return out


def main() -> None:
    from livefit.server.config.sections import TensorFlowSettings
    from livefit.server.train.modeling import configure_tensorflow

    configure_tensorflow(TensorFlowSettings(logical_cpu_devices=2))
    print(json.dumps(measure(json.loads(sys.argv[1]))))


BENCHMARK = Benchmark(
    name="devices",
    summary="livefit's trainer on one device and mirrored on two (logical CPU devices)",
    columns=(
        "1 device samples/s",
        "2 devices samples/s",
        "2 devices ÷ 1 device",
    ),
    run=run,
    sizes=Sizes(
        quick={"batch_sizes": [64], "rounds": 1, "samples": 2_000},
        full={"batch_sizes": [64, 256], "rounds": 4, "samples": 40_000},
    ),
)

if __name__ == "__main__":
    main()
