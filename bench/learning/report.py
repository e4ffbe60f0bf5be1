"""The "Learning quality" section of BENCHMARKS.md, from the benchmark's JSON alone."""

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
    """The section of BENCHMARKS.md for the suite's entry (``to_bench_result``'s JSON)."""
    return markdown(bench["extra"]["learning"])


def markdown(results: dict[str, Any]) -> str:
    """The "Learning quality" section of BENCHMARKS.md for ``results`` (from ``run``)."""
    parts = [_md_intro(results), _md_summary(results), _md_user_config(results)]
    if results["mode"] != "quick":
        parts.append(prose("learning") + "\n")
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
    streams = results["streams"].values()
    n_seeds = len(results["settings"].get("model_seeds", []))
    classifiers = [r for r in streams if r["metric"] == "accuracy"]
    regressors = [r for r in streams if r["metric"] == "mae"]
    lines = [
        "Prequential accuracy (cumulative, test-then-train) at the configuration a user writes: "
        f"livefit through the server (model seed {MODEL_SEED}), and in-process over {n_seeds} "
        "model seeds (mean, and the worst seed); the per-sample linear model is logistic "
        "regression (softmax regression for several classes):\n",
        "| stream | samples | livefit | livefit over seeds: mean (worst) | per-sample linear "
        "| Hoeffding tree | livefit - linear | seeds ≥ linear | target | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in classifiers:
        ref = r["reference"]
        seeds = r.get("seeds")
        spread = f"{pct(seeds['mean'])} ({pct(seeds['worst'])})" if seeds else DASH
        count = f"{seeds['at_least_reference']}/{len(seeds['values'])}" if seeds else DASH
        lines.append(
            f"| {r['title']} | {r['samples']:,} | {pct(r['livefit']['accuracy'])} | {spread} | "
            f"{pct(r['peers'][ref]['accuracy'])} ({short(ref)}) | "
            f"{pct(r['peers'][HT]['accuracy'])} | {pts(r['difference'])} | {count} | "
            f"≥ {short(ref)} | {'pass' if r['pass'] else '**miss**'} |"
        )
    if regressors:
        lines += [
            "",
            'Prequential MAE (cumulative, lower is better), same sides; "after the first '
            'message": the MAE over every sample but the first 25 (livefit in-process, seed '
            f"{MODEL_SEED}), which a minibatch learner predicts before it has seen a label; "
            '"without target scaling": livefit with `target_scaling = "none"` (the network '
            "learns the raw targets, as before target scaling existed), through the server:\n",
            "| stream | samples | livefit | livefit over seeds: mean (worst) | livefit after "
            "the first message | linear regression | LR, standardized target | Hoeffding tree "
            "| livefit without target scaling |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in regressors:
            seeds = r.get("seeds")
            spread = f"{fig(seeds['mean'])} ({fig(seeds['worst'])})" if seeds else DASH
            after = r.get("after_first_message", {}).get("livefit (defaults)", math.nan)
            raw = r["livefit_variants"].get("no target scaling", {}).get("mae")
            lines.append(
                f"| {r['title']} | {r['samples']:,} | {fig(r['livefit']['mae'])} | {spread} | "
                f"{fig(after)} | {fig(r['peers'][LINREG]['mae'])} | "
                f"{fig(r['peers'][LINREG_TSS]['mae'])} | {fig(r['peers'][HT]['mae'])} | "
                f"{fig(raw)} |"
            )
    return "\n".join(lines) + "\n"


def _md_user_config(results: dict[str, Any]) -> str:
    """What the user's configuration gets, in words, from this run's figures."""
    streams = results["streams"]
    classifiers = [r for r in streams.values() if r["metric"] == "accuracy"]
    regressors = [r for r in streams.values() if r["metric"] == "mae"]
    passed = [r["title"] for r in classifiers if r["pass"]]
    missed = [r["title"] for r in classifiers if not r["pass"]]
    text = [
        "**At the configuration a user writes.** Built-in builders take their output from the "
        "loss: a sigmoid for binary cross-entropy, a softmax for (sparse) categorical "
        "cross-entropy (trained on its logits: Keras computes the cross-entropy from the "
        "logits a sigmoid or softmax output keeps), a linear output with online target "
        "standardization for regression losses. "
        f"livefit meets its target on {len(passed)} of {len(classifiers)} classification streams "
        f"at the reference seed" + (f" (misses: {', '.join(missed)})" if missed else "") + ". "
    ]
    trailing = []
    for r in classifiers:
        seeds = r.get("seeds")
        if not seeds or seeds["at_least_reference"] == len(seeds["values"]):
            continue
        ref = r["peers"][r["reference"]]["accuracy"]
        trailing.append(
            f"{r['title']}: {pts(seeds['mean'] - ref)} on average, worst seed "
            f"{pts(seeds['worst'] - ref)}, {len(seeds['values']) - seeds['at_least_reference']}"
            f" of {len(seeds['values'])} seeds below"
        )
    if trailing:
        text.append(
            "Over the model seeds it trails its per-sample linear peer with some seeds on "
            + "; on ".join(trailing)
            + ". "
        )
    text += [_regression_words(r) for r in regressors]
    return "".join(text).rstrip() + "\n"


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
