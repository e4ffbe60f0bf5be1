"""``python -m bench [--quick] [--only NAME] [--soak]``: run, write JSON, render Markdown.

Full runs write ``bench/results/latest.json`` and regenerate ``BENCHMARKS.md`` (the report) and
``bench/results/latest.figures.md`` (every figure); ``--only`` merges its benchmarks into the
existing JSON. ``--quick`` (tiny sizes: checks the harness works, not the speed) writes
``bench/results/quick.json``, ``quick.md`` and ``quick.figures.md`` beside it, so that it never
replaces the committed figures. A benchmark that fails is recorded with its error, the others
still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from rich.console import Console
from rich.table import Table

from bench.harness import REPO, Context, Mode, SharedFleet
from bench.load import describe_client, pick_client
from bench.machine import machine_facts, now_iso
from bench.registry import BENCHMARKS

SCHEMA = 1
# Benchmarks that size TensorFlow's pools for their own process (the trainer: as livefit sizes
# a training process's) run in a child process of their own, so that the in-process
# benchmarks after them (runtimes' serving models, the learning benchmark's learners) keep
# TensorFlow's default pools, as livefit's serving does.
ISOLATED = frozenset({"trainer"})
_CHILD_ENV = "LIVEFIT_BENCH_CHILD"  # set to the benchmark's name in its child process


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _stop_cleanly_on_signals()
    console = Console(width=max(120, shutil.get_terminal_size((120, 40)).columns))
    mode = "quick" if args.quick else "soak" if args.soak else "full"
    json_path = Path(args.json or REPO / "bench" / "results" / f"{_stem(mode)}.json")
    md_path = Path(
        args.markdown or (REPO / "bench/results/quick.md" if args.quick else REPO / "BENCHMARKS.md")
    )
    if args.render:
        return _render(json_path, md_path, console)
    names = _selected(args.only)
    doc = _load(json_path) if args.only or mode == "soak" else _new_doc()
    client = pick_client(args.load_client)
    console.rule(f"livefit benchmarks: {', '.join(names)} ({mode} mode)")
    console.log(f"load client: {describe_client(client)}")
    facts = machine_facts()
    console.log(
        f"machine: {facts['cores_usable']} cores, {facts['cpu_model']}, "
        f"{facts['device']}, TensorFlow {facts['tensorflow']}"
    )
    workdir = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="livefit-bench-"))
    )
    failed = False
    shared = SharedFleet(workdir / "shared") if mode == "quick" else None
    try:
        for name in names:
            entry = _run_one(name, mode, client, workdir / name, console, facts, shared)
            failed |= "error" in entry
            doc["benchmarks"][name] = entry
            doc["generated_at"] = now_iso()
            _write(json_path, doc)  # after each benchmark: a crash later keeps what was measured
    finally:
        if shared is not None:
            shared.stop()
        if not args.keep_workdir and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    _render(json_path, md_path, console)
    _summary(doc, names, console)
    return 1 if failed else 0


def _stop_cleanly_on_signals() -> None:
    """SIGTERM, and SIGINT even where a shell started us ignoring it, unwind the stack, so
    every ``finally`` stops the processes it started."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check the harness")
    parser.add_argument(
        "--soak",
        action="store_true",
        help="long memory run (1M samples, 200k requests); use with --only memory",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these ({', '.join(BENCHMARKS)}); repeat or comma-separate",
    )
    parser.add_argument("--json", metavar="PATH", help="results file (default by mode)")
    parser.add_argument("--markdown", metavar="PATH", help="Markdown to regenerate")
    parser.add_argument("--render", action="store_true", help="only regenerate the Markdown")
    parser.add_argument(
        "--load-client",
        choices=["auto", "wrk", "python"],
        default="auto",
        help="HTTP load client (auto: wrk when on PATH)",
    )
    parser.add_argument("--workdir", help="where logs and configs go (kept); default a temp dir")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temp dir")
    return parser


def _stem(mode: str) -> str:
    return "quick" if mode == "quick" else "latest"


def _selected(only: list[str] | None) -> list[str]:
    if not only:
        return list(BENCHMARKS)
    names = {n.strip() for item in only for n in item.split(",") if n.strip()}
    unknown = sorted(names - set(BENCHMARKS))
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    return [n for n in BENCHMARKS if n in names]  # always in the suite's order


def _run_one(
    name: str,
    mode: str,
    client: str,
    workdir: Path,
    console: Console,
    facts: dict[str, Any],
    shared: SharedFleet | None,
) -> dict[str, Any]:
    if name in ISOLATED and os.environ.get(_CHILD_ENV) != name:
        return _run_in_child(name, mode, client, workdir, console)
    benchmark = BENCHMARKS[name]
    console.rule(f"{name}: {benchmark.summary}")
    ctx = Context(
        mode=cast(Mode, mode),
        workdir=workdir,
        console=console,
        load_client=client,
        shared=shared,
        sizes=benchmark.sizes.of(cast(Mode, mode)),
    )
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    meta = {
        "mode": mode,
        "machine": {**facts, "recorded_at": now_iso()},
        "load_client": describe_client(client),
    }
    try:
        result = benchmark.run(ctx)
    except Exception as exc:
        console.print_exception(max_frames=8)
        return {
            "name": name,
            "title": name,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:],
            **meta,
            "seconds": time.monotonic() - started,
        }
    if "tensorflow" in sys.modules:  # the pools as the benchmark left them (it may size them)
        tf = sys.modules["tensorflow"]
        meta["machine"]["tf_intra_op_threads"] = (
            tf.config.threading.get_intra_op_parallelism_threads()
        )
        meta["machine"]["tf_inter_op_threads"] = (
            tf.config.threading.get_inter_op_parallelism_threads()
        )
    entry = {**result.to_json(), **meta, "seconds": time.monotonic() - started}
    console.log(f"{name} done in {entry['seconds']:.0f} s")
    return entry


def _run_in_child(
    name: str, mode: str, client: str, workdir: Path, console: Console
) -> dict[str, Any]:
    """``name`` run by ``python -m bench --only name`` in a child process (``ISOLATED``); its
    entry, or one with the error where the child wrote none."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "child.json"
    argv = [sys.executable, "-m", "bench", "--only", name, "--json", str(out),
            "--markdown", str(workdir / "child.md"), "--workdir", str(workdir / "child"),
            "--load-client", client]  # fmt: skip
    if mode != "full":
        argv.append(f"--{mode}")
    console.log(f"{name}: in a process of its own (it sizes TensorFlow's pools)")
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, _CHILD_ENV: name}, check=False)
    try:
        return cast(dict[str, Any], json.loads(out.read_text())["benchmarks"][name])
    except (OSError, ValueError, KeyError) as exc:
        return {
            "name": name,
            "title": name,
            "error": f"its process (exit status {done.returncode}) wrote no result: {exc}",
            "seconds": time.monotonic() - started,
        }


def _new_doc() -> dict[str, Any]:
    return {"schema": SCHEMA, "generated_at": now_iso(), "benchmarks": {}}


def _load(path: Path) -> dict[str, Any]:
    if path.exists():
        doc = json.loads(path.read_text())
        if doc.get("schema") == SCHEMA:
            return doc
    return _new_doc()


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    tmp.replace(path)


def _render(json_path: Path, md_path: Path, console: Console) -> int:
    """The report at ``md_path`` and every figure beside the JSON (``<stem>.figures.md``)."""
    from bench.harness import NOTES
    from bench.report import render, render_figures

    if not json_path.exists():
        console.print(f"[red]no results at {json_path}; run the benchmarks first")
        return 1
    doc = json.loads(json_path.read_text())
    figures_path = json_path.with_name(f"{json_path.stem}.figures.md")
    md_path.parent.mkdir(parents=True, exist_ok=True)

    def shown(path: Path) -> str:
        """A path as the report links it: from the repository's root (where BENCHMARKS.md is)
        when it lies inside, else absolute, so the report reads the same wherever it is."""
        path = path.resolve()
        return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)

    notes_from_figures = (
        os.path.relpath(NOTES, figures_path.resolve().parent)
        if figures_path.resolve().is_relative_to(REPO)
        else str(NOTES)
    )
    md_path.write_text(render(doc, shown(json_path), shown(figures_path), shown(NOTES)))
    figures_path.write_text(render_figures(doc, shown(json_path), notes_from_figures))
    console.log(f"wrote {md_path} and {figures_path} from {json_path}")
    return 0


def _summary(doc: dict[str, Any], names: list[str], console: Console) -> None:
    table = Table(title="targets (median of paired repeats)")
    for column in ("benchmark", "case", "target", "observed", "result"):
        table.add_column(column)
    for name in names:
        bench = doc["benchmarks"][name]
        if "error" in bench:
            table.add_row(name, "", "", bench["error"][:60], "[red]error")
            continue
        for row in bench["rows"]:
            case = ", ".join(f"{k} {v}" for k, v in row["case"].items())
            for t in row["targets"]:
                verdict = "[green]pass" if t["pass"] else "[red]miss"
                table.add_row(name, case, t["label"], f"{t['observed']:.3g}", verdict)
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
