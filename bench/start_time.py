"""From ``livefit serve`` to ready: how long a learner takes to start, and the CPU each of its
processes spent until then and their memory together, and for the split layout how long a
SIGKILLed serving process takes to serve again, for the code of one or more git revisions side by
side.

    .venv/bin/python -m bench.start_time --out rows.json [--refs HEAD,481bfeb~1]
        [--layouts one,split] [--repeats 5]

A ref's code is unpacked from git (``bench.trees.code_at``; "." is the working tree) and run with
this interpreter. Each start is a learner of one model (the ``linear`` builder, 8 inputs) with
fresh storage, on a mosquitto of the run's own; the refs and layouts take turns, so that a slow
spell of the machine hits each of them; a first start, not counted, warms the page cache. The
CPU is read from each process of the learner (the split layout's training and serving processes
too, and its fork server) the moment readiness answers 200, then their proportional set size
(PSS: shared pages divided among the processes that map them); then, split, the one serving
process is SIGKILLed and readiness asked on new connections until it answers 200.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.config import learner_config, relocated
from bench.trees import code_at
from livefit.local_servers import LivefitProcess
from livefit.server.base.logs import WORKER_ENV
from livefit.server.runtime.fork_server import SERVING_PREFIX
from livefit.server.runtime.local_process import quiet_env
from livefit.server.runtime.mosquitto import Mosquitto

LAYOUTS = {"one": 0, "split": 1}  # http.workers
WORKING_TREE = "."
MODEL = {"builder": "linear", "input_shape": [8], "output_shape": [1]}
EXTRAS = (("pss_mib", "PSS", "MiB"), ("serving_back_s", "serving again after SIGKILL", "s"))


def config(broker_url: str, storage: Path, workers: int) -> str:
    """The learner's config (``bench.config``): one linear model, ``workers`` serving
    processes (0: one process)."""
    text = learner_config(broker_url, str(storage), f"start-{storage.name}", {"demo": MODEL})
    return relocated(text, broker_url, str(storage), workers)


def process_cpu(pid: int) -> list[float]:
    """CPU seconds (user and system) of ``pid`` and of each of its descendants."""
    root = psutil.Process(pid)
    cpu = []
    for process in [root, *root.children(recursive=True)]:
        times = process.cpu_times()
        cpu.append(round(times.user + times.system, 3))
    return cpu


def start_once(
    tree: Path | None, layout: str, broker: Mosquitto, work: Path, index: int
) -> dict[str, Any]:
    """Start one learner of ``tree``'s code (None: this checkout's), wait until ready, read its
    processes' CPU, stop it: one row."""
    storage = work / f"data-{index}"
    env = quiet_env() if tree is None else quiet_env(PYTHONPATH=str(tree))
    process = LivefitProcess(
        config(broker.url, storage, LAYOUTS[layout]), work / f"learner-{index}", env=env, cwd=tree
    )
    started = time.monotonic()
    try:
        process.start(ready_timeout_s=120)
        ready_s = time.monotonic() - started
        cpu = process_cpu(process.pid)
        row: dict[str, Any] = {"layout": layout, "ready_s": round(ready_s, 3),
                               "cpu_s": round(sum(cpu), 3), "process_cpu_s": cpu,
                               "pss_mib": round(tree_pss(process.pid) / 2**20, 1)}  # fmt: skip
        if LAYOUTS[layout] == 1:
            row["serving_back_s"] = round(serving_back_after_sigkill(process), 3)
    finally:
        process.stop()
    return row


def tree_pss(pid: int) -> int:
    """The proportional set size of ``pid`` and its descendants together (bytes): each shared
    page divided among the processes that map it."""
    root = psutil.Process(pid)
    return sum(each.memory_full_info().pss for each in [root, *root.children(recursive=True)])


def serving_process(pid: int) -> psutil.Process:
    """The serving process of the split learner whose parent is ``pid``: named so
    (``fork_server.name_process``), or, in code from before the names, started with the
    variable its parent sets."""
    for each in psutil.Process(pid).children(recursive=True):
        if each.name().startswith(SERVING_PREFIX) or WORKER_ENV in each.environ():
            return each
    raise RuntimeError(f"no serving process under pid {pid}")


def serving_back_after_sigkill(learner: LivefitProcess) -> float:
    """SIGKILL the split learner's one serving process; seconds until readiness answers 200
    again on a new connection (the port's backlog holds it until a serving process accepts)."""
    serving_process(learner.pid).kill()
    killed = time.monotonic()
    while time.monotonic() - killed < 120:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{learner.url}/v2/health/ready", timeout=30).status_code == 200:
                return time.monotonic() - killed
        time.sleep(0.02)
    raise RuntimeError("the serving process was not back within 120 s")


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per ref and layout: the starts' median time to ready and CPU, with their range."""
    lines = []
    keys = sorted({(row["ref"], row["layout"]) for row in rows}, key=lambda k: (k[1], k[0]))
    for ref, layout in keys:
        mine = [row for row in rows if row["ref"] == ref and row["layout"] == layout]
        ready = [row["ready_s"] for row in mine]
        cpu = [row["cpu_s"] for row in mine]
        line = (
            f"{layout:5} {ref:12} ready {statistics.median(ready):5.2f} s "
            f"({min(ready):.2f}-{max(ready):.2f}), CPU {statistics.median(cpu):5.2f} s "
            f"({min(cpu):.2f}-{max(cpu):.2f}), {len(mine)} starts"
        )
        for key, what, unit in EXTRAS:
            values = [row[key] for row in mine if key in row]
            if values:
                line += (f"; {what} {statistics.median(values):.2f} {unit} "
                         f"({min(values):.2f}-{max(values):.2f})")  # fmt: skip
        lines.append(line)
    return lines


def run(refs: Sequence[str], layouts: Sequence[str], repeats: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="livefit-start-") as scratch:
        work = Path(scratch)
        trees: dict[str, Path | None] = {}
        for ref in refs:
            tree = None if ref == WORKING_TREE else code_at(ref, work / f"tree-{len(trees)}")
            if ref != WORKING_TREE and tree is None:
                raise SystemExit(f"no such revision in this repository: {ref}")
            trees[ref] = tree
        broker = Mosquitto(work / "mosquitto")
        broker.start()
        try:
            # not counted: the run's first start also reads TensorFlow's files into the page cache
            start_once(next(iter(trees.values())), layouts[0], broker, work, -1)
            for repeat in range(repeats):
                for layout in layouts:
                    for ref, tree in trees.items():
                        row = start_once(tree, layout, broker, work, len(rows))
                        rows.append({"ref": ref, "repeat": repeat, **row})
                        back = row.get("serving_back_s")
                        print(
                            f"{repeat + 1}/{repeats} {layout:5} {ref:12} "
                            f"ready {row['ready_s']:.2f} s, CPU {row['cpu_s']:.2f} s, "
                            f"PSS {row['pss_mib']:.0f} MiB"
                            + ("" if back is None else f", serving again {back:.2f} s")
                        )
        finally:
            broker.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.start_time", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="rows as JSON")
    parser.add_argument(
        "--refs",
        default=WORKING_TREE,
        help='comma-separated git revisions; "." is the working tree',
    )
    parser.add_argument("--layouts", default="one,split", help="one, split or both")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {', '.join(LAYOUTS)}")
    refs = [ref for ref in args.refs.split(",") if ref]
    rows = run(refs, layouts, args.repeats)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
