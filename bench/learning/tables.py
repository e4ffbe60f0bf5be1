"""The tables of the "Learning quality" section: per stream, over its course, per model seed,
the sweep and its robustness, and the server against in-process."""

from __future__ import annotations

import itertools
import math
from typing import Any

from bench.config import toml_value
from bench.learning.knobs import MODEL_SEED
from bench.learning.peers import LR, SOFTMAX
from bench.learning.streams import BINARY, MULTICLASS, STREAMS

DASH = "\u2013"  # en dash, for ranges


def stream_section(r: dict[str, Any]) -> str:
    metric, ref = r["metric"], r["reference"]
    if r["task"] == BINARY:
        what = f"{r['positive_share']:.0%} positive"
    elif r["task"] == MULTICLASS:
        what = f"{len(r['classes'])} classes"
    else:
        what = f"target mean {r['target_mean']:.1f}, standard deviation {r['target_std']:.1f}"
    table = ", ".join(f"{k} = {toml_value(v)}" for k, v in r["table"].items())
    lines = [
        f"### {r['title']}\n",
        f"{r['source']}; {r['samples']:,} samples, {len(r['features'])} features, {what}. "
        f"livefit's table: `{table}`.\n",
    ]
    sides = {"livefit (defaults)": r["livefit"]}
    sides.update({f"livefit ({k})": v for k, v in r["livefit_variants"].items()})
    lines += (_accuracy_rows if metric == "accuracy" else _mae_rows)(r, sides)
    return "\n".join(lines) + "\n" + _segments_table(r.get("segments"), metric, ref)


def _accuracy_rows(r: dict[str, Any], sides: dict[str, dict[str, Any]]) -> list[str]:
    ref = r["reference"]
    lines = [
        f"| side | settings | accuracy | log loss | vs {short(ref)} | updates | mean batch "
        "| drifts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ref_value = r["peers"][ref]["accuracy"]
    for name, s in sides.items():
        lines.append(
            f"| {name} | {s['label']} | {pct(s['accuracy'])} | {s['log_loss']:.3f} | "
            f"{pts(s['accuracy'] - ref_value)} | {_updates(s)}"
        )
    lines += [
        f"{_peer(name, p)} {pct(p['accuracy'])} | {p['log_loss']:.3f} | "
        f"{pts(p['accuracy'] - ref_value)} | {p['samples']:,} | 1 | |"
        for name, p in r["peers"].items()
    ]
    return lines


def _mae_rows(r: dict[str, Any], sides: dict[str, dict[str, Any]]) -> list[str]:
    after = r.get("after_first_message", {})
    lines = [
        "| side | settings | MAE | RMSE | MAE after the first message | vs linear regression "
        "| updates | mean batch | drifts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ref_value = r["peers"][r["reference"]]["mae"]
    for name, s in sides.items():
        lines.append(
            f"| {name} | {s['label']} | {fig(s['mae'])} | {fig(s['rmse'])} | "
            f"{fig(after.get(name, math.nan))} | {fig(s['mae'] - ref_value, sign=True)} | "
            f"{_updates(s)}"
        )
    lines += [
        f"{_peer(name, p)} {fig(p['mae'])} | {fig(p['rmse'])} | "
        f"{fig(p.get('mae_after_first_message', math.nan))} | "
        f"{fig(p['mae'] - ref_value, sign=True)} | {p['samples']:,} | 1 | |"
        for name, p in r["peers"].items()
    ]
    return lines


def _updates(side: dict[str, Any]) -> str:
    """A livefit side's last cells: updates, mean batch size, drift detections."""
    return (
        f"{side.get('steps', '')} | {num(side.get('mean_batch_size'))} | "
        f"{side.get('drift_detections', '')} |"
    )


def _peer(name: str, peer: dict[str, Any]) -> str:
    """A river peer's first cells: its name and how it is built (pipes escaped)."""
    how = peer.get("how", "").replace("|", "\\|")
    return f"| river {name} | {how}, per sample |"


def _segments_table(seg: dict[str, Any] | None, metric: str, reference: str) -> str:
    """Figures within stretches of the stream (livefit in-process, same settings and order)."""
    if not seg:
        return ""
    shown = pct if metric == "accuracy" else fig
    edges = seg["edges"]
    spans = [f"{a:,}{DASH}{b:,}" for a, b in itertools.pairwise(edges) if b > a]
    what = "Accuracy" if metric == "accuracy" else "MAE"
    lines = [
        f"\n{what} within stretches of the stream (livefit in-process):\n",
        "| side | " + " | ".join(spans) + " |",
        "|---|" + "---|" * len(spans),
    ]
    for side, values in seg["sides"].items():
        lines.append(f"| {side} | " + " | ".join(shown(v) for v in values) + " |")
    mine, ref = seg["sides"].get("livefit (defaults)"), seg["sides"].get(reference)
    if mine and ref:
        n = edges[-1]
        shares = [
            (a - b) * (hi - lo) / n
            for a, b, (lo, hi) in zip(mine, ref, itertools.pairwise(edges), strict=False)
        ]
        if metric == "accuracy":
            cells = " | ".join(pts(v) for v in shares)
        else:
            cells = " | ".join(fig(v, sign=True) for v in shares)
        lines.append(f"| livefit (defaults) - {short(reference)}, share of the whole | {cells} |")
    return "\n".join(lines) + "\n"


def model_seeds_table(results: dict[str, Any]) -> str:
    rows = [r for r in results["streams"].values() if "seeds" in r]
    if not rows:
        return ""
    seeds = rows[0]["seeds"]["seeds"]
    lines = [
        "### Model seeds\n",
        f"The user's configuration with model seeds {', '.join(map(str, seeds))} "
        f"({MODEL_SEED} is the reference), in-process on the same samples "
        f"({results.get('seeds_seconds', 0):.0f} s): accuracy, or MAE for regression.\n",
        "Before #30: the defaults without the start boost and drift reaction, same seeds.\n",
        "| stream | mean | worst | best | before #30: mean | before #30: worst "
        "| at least as good as the linear peer | per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["seeds"]
        shown = pct if r["metric"] == "accuracy" else fig
        b = s.get("before", {})
        before = f"{shown(b['mean'])} | {shown(b['worst'])}" if b else f"{DASH} | {DASH}"
        lines.append(
            f"| {r['title']} | {shown(s['mean'])} | {shown(s['worst'])} | {shown(s['best'])} | "
            f"{before} | "
            f"{s['at_least_reference']}/{len(s['values'])} ({short(r['reference'])} "
            f"{shown(r['peers'][r['reference']][r['metric']])}) | "
            + " / ".join(shown(v) for v in s["values"])
            + " |"
        )
    return "\n".join(lines) + "\n"


def sweep_table(sweep: dict[str, Any]) -> str:
    names = list(sweep["rows"][0]["streams"]) if sweep["rows"] else []
    head = " | ".join(STREAMS[n].title if n in STREAMS else n for n in names)
    lines = [
        "### Defaults sweep\n",
        "In-process (the server's trainer, chunks of 25, no MQTT) on the binary streams; "
        "prequential accuracy per stream, Δ = accuracy minus logistic regression's. "
        f"Criterion: {sweep['criterion']}. Best: **{sweep['best']}**; "
        f"recommended: **{sweep['recommended']}**. Sweep time: {sweep['seconds']:.0f} s.\n",
        f"*{sweep['carried_from']}*\n" if sweep.get("carried_from") else "",
        f"{sweep.get('why_recommended', '')}\n",
        f"| stage | settings | seeds | {head} | worst Δ | mean Δ | s |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for row in sweep["rows"]:
        figures = " | ".join(pct(row["streams"][n]["accuracy"]) for n in names)
        seconds = sum(row["streams"][n]["seconds"] for n in names)
        lines.append(
            f"| {row['stage']} | {row['label']} | {row['seed']}/{row['stream_seed']} | {figures} | "
            f"{pts(row['worst_margin'])} | {pts(row['mean_margin'])} | {seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def seeds_table(sweep: dict[str, Any]) -> str:
    if not sweep["seeds"]:
        return ""
    names = [n for n in STREAMS if n in sweep["seeds"][0]["streams"]]
    lines = [
        "Robustness: the same settings with other seeds (model initialisation, and the "
        "synthetic generators); accuracy min\u2013max, mean margin over LR on the same samples:\n",
        "| settings | seeds (model / stream) | "
        + " | ".join(STREAMS[n].title for n in names)
        + " | worst Δ |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    for s in sweep["seeds"]:
        cells = " | ".join(
            f"{pct(s['streams'][n]['min'])}{DASH}{pct(s['streams'][n]['max'])} "
            f"(mean {pts(s['streams'][n]['mean_margin'])})"
            for n in names
        )
        seeds = ", ".join(f"{m}/{t}" for m, t in s["seeds"])
        lines.append(f"| {s['label']} | {seeds} | {cells} | {pts(s['worst_margin'])} |")
    return "\n".join(lines) + "\n"


def agreement_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "Through the server vs in-process, same settings (the in-process figures stand for the "
        "server's when these agree):\n",
        "| stream | settings | metric | server | in-process | difference | server mean batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        metric = r.get("metric", "accuracy")
        if metric == "accuracy":
            figures = f"{pct(r['server'])} | {pct(r['in_process'])} | {pts(r['difference'])}"
        else:
            difference = fig(r["difference"], sign=True)
            figures = f"{fig(r['server'])} | {fig(r['in_process'])} | {difference}"
        lines.append(
            f"| {r['stream']} | {r['side']} | {metric} | {figures} | "
            f"{num(r['server_mean_batch_size'])} |"
        )
    return "\n".join(lines) + "\n"


def short(peer: str) -> str:
    return {LR: "LR", SOFTMAX: "softmax"}.get(peer, peer)


def pct(value: float | None) -> str:
    return DASH if value is None or math.isnan(value) else f"{100 * value:.2f} %"


def pts(value: float) -> str:
    return f"{100 * value:+.2f} pts"


def num(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.1f}"


def fig(value: float | None, sign: bool = False) -> str:
    """A MAE or RMSE (or, with ``sign``, a difference of two): about three significant digits."""
    if value is None or math.isnan(value):
        return DASH
    magnitude = abs(value)
    decimals = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else 3
    return f"{value:{'+' if sign else ''},.{decimals}f}"


def start_and_recovery_table(results: dict[str, Any]) -> str:
    """The first 500 samples of every stream, and the recovery after each drift, per side."""
    rows = list(results["streams"].values())
    if not rows or "first_500" not in rows[0]:
        return ""
    lines = [
        "### Fast starts and drift recovery\n",
        "In-process at the reference seed, on the server's samples. **First 500**: accuracy (MAE "
        "for regression) over each stream's first 500 samples. **Recovery**: samples after a "
        "drift until the accuracy over the last 500 (all after the drift) is back within 1 "
        "point of the 500 before it (MAE: within 1 %); never: not in the stream. **After**: "
        "accuracy over the 1,000 samples after the drift.\n",
        "| stream | side | first 500 | recovery (samples, per drift) | after (per drift) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        shown = pct if r["metric"] == "accuracy" else fig
        recovery = r.get("recovery", {"drifts": [], "sides": {}})
        for side, first in r["first_500"].items():
            rec = recovery["sides"].get(side)
            samples = (
                " / ".join("never" if n is None else f"{n:,}" for n in rec["samples"])
                if rec
                else DASH
            )
            after = " / ".join(shown(v) for v in rec["after_1000"]) if rec else DASH
            lines.append(f"| {r['title']} | {side} | {shown(first)} | {samples} | {after} |")
    return "\n".join(lines) + "\n"
