"""The "Learning quality" sections of BENCHMARKS.md (a table) and of every figure
(``bench/results/latest.figures.md``), from the benchmark's JSON alone."""

from __future__ import annotations

import math
from typing import Any

from bench.harness import prose
from bench.learning.knobs import MODEL_SEED, describe
from bench.learning.peers import HT, LINREG, LINREG_TSS
from bench.learning.streams import CHUNK
from bench.learning.tables import (
    DASH,
    agreement_table,
    fig,
    model_seeds_table,
    pct,
    pts,
    seeds_table,
    short,
    start_and_recovery_table,
    stream_section,
    sweep_table,
)


def section(bench: dict[str, Any]) -> str:
    """The section of every figure (``bench/results/latest.figures.md``) for the suite's entry
    (``to_bench_result``'s JSON)."""
    return markdown(bench["extra"]["learning"])


def table(bench: dict[str, Any]) -> list[str]:
    """The table of BENCHMARKS.md for the suite's entry: livefit against river's best per
    stream, and what the user's configuration gets in words."""
    results = bench["extra"]["learning"]
    return [*_md_summary(results).splitlines(), "", *_md_verdict(results).splitlines()]


def markdown(results: dict[str, Any]) -> str:
    """The whole "Learning quality" section for ``results`` (from ``run``)."""
    parts = [_md_intro(results), _md_summary(results), _md_user_config(results)]
    if results["mode"] != "quick":
        parts.append(
            "How the update defaults were found, and what else was tried:"
            " [docs/benchmarks/learning.md](../../docs/benchmarks/learning.md).\n"
        )
    parts += [stream_section(stream) for stream in results["streams"].values()]
    parts.append(model_seeds_table(results))
    parts.append(start_and_recovery_table(results))
    if "sweep" in results:
        parts += [sweep_table(results["sweep"]), seeds_table(results["sweep"])]
    if "agreement" in results:
        parts.append(agreement_table(results["agreement"]))
    parts.append(_md_machine(results))
    return "\n".join(p for p in parts if p).rstrip() + "\n"


def _md_intro(results: dict[str, Any]) -> str:
    s = results["settings"]
    first = max((r["samples"] for r in results["streams"].values()), default=0)
    quick = (
        f"\n**Quick mode**: the first {first} samples of each stream; this checks the "
        "harness, not the quality.\n"
        if results["mode"] == "quick"
        else ""
    )
    return (
        "## Learning quality\n\n"
        f"{prose('learning-intro')}\n\n"
        f"Target: {s['target']}. Every livefit model: {s['model']}. livefit's defaults in this "
        f"run: {describe(s['defaults'])}. Log loss: {s['log_loss']}. Messages of "
        f"{s['samples_per_message']} samples, QoS {s['qos']}, published at "
        f"{s['publish_rate_samples_per_s']:g} samples/s.\n{quick}"
    )


def _md_summary(results: dict[str, Any]) -> str:
    """One table: livefit against river's best in the server's protocol (the target), with
    river's best sample by sample beside it."""
    n_seeds = len(results["settings"].get("model_seeds", []))
    lines = [
        "Prequential accuracy (MAE for regression, lower is better), cumulative, at the "
        f"configuration a user writes: livefit through the server (model seed {MODEL_SEED}) "
        f"and in-process over {n_seeds} model seeds (mean, and the worst seed); river's best "
        "of its linear model, Hoeffding adaptive tree and adaptive random forest, in the "
        "server's protocol (each minibatch livefit's trainer takes predicted whole, then "
        "learned sample by sample) and sample by sample (river's own protocol):\n",
        "| stream | samples | livefit | livefit over seeds: mean (worst) | river's best, "
        "server's protocol | gap: mean (worst) | river's best, sample by sample | gap | "
        "result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["streams"].values():
        metric = r["metric"]
        shown = pct if metric == "accuracy" else fig
        seeds = r.get("seeds")
        spread = f"{shown(seeds['mean'])} ({shown(seeds['worst'])})" if seeds else DASH
        best, per_sample = r.get("best_in_batches"), r["best_per_sample"]
        gap = gap_sample = DASH
        if seeds and best:
            gap = f"{_gap(seeds['mean'], best, metric)} ({_gap(seeds['worst'], best, metric)})"
        if seeds:
            gap_sample = _gap(seeds["mean"], per_sample, metric)
        verdict = DASH if r["pass"] is None else ("pass" if r["pass"] else "**miss**")
        lines.append(
            f"| {r['title']} | {r['samples']:,} | {shown(r['livefit'][metric])} | {spread} | "
            + (f"{shown(best['value'])} ({short(best['peer'])})" if best else DASH)
            + f" | {gap} | {shown(per_sample['value'])} ({short(per_sample['peer'])}) | "
            f"{gap_sample} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def _gap(value: float, best: dict[str, Any], metric: str) -> str:
    """Accuracy points ahead (+) or behind river's best; a MAE as a ratio to it."""
    if metric == "accuracy":
        return pts(value - best["value"])
    return f"{value / best['value']:.3f}x"


def _md_user_config(results: dict[str, Any]) -> str:
    """What the user's configuration gets, in words, from this run's figures."""
    verdict = _md_verdict(results)
    if not verdict:
        return ""
    words = [_regression_words(r) for r in results["streams"].values() if r["metric"] == "mae"]
    return verdict + "".join(words).rstrip() + ("\n" if any(words) else "")


def _md_verdict(results: dict[str, Any]) -> str:
    """The streams where livefit meets its target and where it misses, and what a model is."""
    judged = [r for r in results["streams"].values() if r["pass"] is not None]
    missed = [r["title"] for r in judged if not r["pass"]]
    if not judged:
        return ""
    return (
        "**Against the target** (above): livefit meets it on "
        f"{len(judged) - len(missed)} of {len(judged)} streams"
        + (f"; it misses on {', '.join(missed)}" if missed else "")
        + ". Built-in builders take their output from the loss (a sigmoid for binary "
        "cross-entropy, a softmax for (sparse) categorical cross-entropy, a linear output with "
        "online target standardization for regression losses), and every model is the "
        "configured network and a linear expert, mixed by their recent errors "
        "(docs/design.md, Experts).\n"
    )


def _regression_words(r: dict[str, Any]) -> str:
    """A regression stream's MAE against the peers, before and after the first message."""
    seeds = r.get("seeds")
    after = r.get("after_first_message", {})
    mine = after.get("livefit (defaults)", math.nan)
    if not seeds or math.isnan(mine):
        return ""
    inproc = seeds["values"][seeds["seeds"].index(MODEL_SEED)]
    n = r["samples"]
    first = inproc - mine * (n - CHUNK) / n
    raw = r["livefit_variants"].get("no target scaling", {}).get("mae")
    return (
        f"On {r['title'].split(' (')[0]} (targets around {r['target_mean']:.0f}, standard "
        f"deviation {r['target_std']:.1f}) livefit's MAE is {fig(r['livefit']['mae'])}"
        + (f" ({fig(raw)} without target scaling)" if raw is not None else "")
        + f" against {fig(r['peers'][LINREG]['mae'])} for river's linear regression, "
        f"{fig(r['peers'][LINREG_TSS]['mae'])} with its target standardized and "
        f"{fig(r['peers'][HT]['mae'])} for the Hoeffding tree; its first message alone "
        f"(25 samples, each predicted by the weights before its batch: at about 0 without "
        f"the fast start) adds {fig(first)} to it, and "
        f"after it livefit's MAE is {fig(mine)} against {fig(after[LINREG])}, "
        f"{fig(after[LINREG_TSS])} and {fig(after[HT])}. "
    )


def _md_machine(results: dict[str, Any]) -> str:
    m = results["machine"]
    parts = []
    if "seeds_seconds" in results:
        parts.append(f"model seeds {results['seeds_seconds']:.0f} s")
    if "sweep" in results:
        parts.append(f"sweep {results['sweep']['seconds']:.0f} s")
    split = f"; {', '.join(parts)}" if parts else ""
    return (
        f"Run {results['generated_at']} in {results['seconds']:.0f} s ({results['mode']} mode"
        f"{split}) on {m.get('cores_usable')} cores, {m.get('cpu_model')}, {m.get('device')}, "
        f"TensorFlow {m.get('tensorflow')}, livefit {m.get('livefit')} "
        f"(commit {m.get('commit')}).\n"
    )
