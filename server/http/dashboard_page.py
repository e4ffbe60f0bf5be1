"""The dashboard page: one self-contained HTML document (inline CSS and JS, charts on plain
``<canvas>``, nothing loaded from anywhere) that polls ``api/stats`` every second.
``render_page`` fills in the process's role. Data only, no I/O.
"""

from __future__ import annotations

import html


def render_page(role: str) -> str:
    """The dashboard HTML for a process of ``role`` ("learner" or "replica")."""
    return PAGE.replace("__ROLE__", html.escape(role))


PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>livefit &ndash; __ROLE__</title>
<style>
:root {
  --bg: #f4f6f8; --panel: #fff; --ink: #1d2733; --muted: #64707d; --grid: #e3e7eb;
  --ok: #1b873f; --bad: #c62828;
  font: 14px/1.35 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
}
body { margin: 0; background: var(--bg); color: var(--ink); }
header { display: flex; align-items: baseline; gap: 1rem; padding: .8rem 1.2rem;
  background: #1d2733; color: #fff; }
header h1 { margin: 0; font-size: 1.25rem; font-weight: 600; }
header .role { color: #9fc3e7; }
#status { margin-left: auto; font-size: .9rem; }
#status::before { content: "\25CF  "; color: var(--muted); }
#status.ok::before { color: #4cd07d; }
#status.bad::before { color: #ff6b6b; }
main { padding: .6rem 1.2rem 1.2rem; }
section.model h2 { margin: .6rem 0 .5rem; font-size: 1.1rem; }
.totals { display: flex; flex-wrap: wrap; gap: .5rem; margin-bottom: .6rem; }
.total { background: var(--panel); border-radius: 6px; padding: .35rem .7rem;
  box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.total .name { color: var(--muted); font-size: .8rem; display: block; }
.total .v { font-size: 1.15rem; font-variant-numeric: tabular-nums; font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: .7rem; }
.panel { background: var(--panel); border-radius: 6px; padding: .5rem .7rem .4rem;
  box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.panel[hidden] { display: none; }
.panel h3 { margin: 0; font-size: .92rem; font-weight: 600; }
.panel .unit { color: var(--muted); font-weight: 400; }
.legend { display: flex; flex-wrap: wrap; gap: .2rem .9rem; margin: .15rem 0 .2rem;
  font-size: .82rem; color: var(--muted); }
.legend .v { color: var(--ink); font-weight: 600; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: .8rem; height: .22rem; border-radius: 2px;
  vertical-align: middle; margin-right: .3rem; }
canvas { display: block; width: 100%; height: 150px; }
.empty { color: var(--muted); padding: 2rem 0; }
</style>
</head>
<body>
<header>
  <h1>livefit <span class="role">&ndash; __ROLE__</span></h1>
  <span id="status" role="status">connecting…</span>
</header>
<main id="models"><p class="empty">Waiting for the first poll…</p></main>
<script>
"use strict";
const POLL_MS = 1000, TIMEOUT_MS = 3000, WINDOW_S = 120, KEEP = 600;
const COLORS = ["#1f77b4", "#e4572e", "#2ca02c", "#9467bd"];
// Each chart: series keys from derive(), roles it is shown for, and its unit.
const PANELS = [
  {id: "samples", title: "Samples trained", unit: "/s", roles: ["learner"],
   series: [["samples_per_s", "samples/s"]]},
  {id: "queue", title: "Queue depth", unit: "samples", roles: ["learner"],
   series: [["queue_depth", "waiting"]]},
  {id: "loss", title: "Loss", unit: "", roles: ["learner"],
   series: [["train_loss", "train (last step)"], ["prequential_loss", "prequential"]]},
  {id: "accuracy", title: "Prequential accuracy", unit: "", roles: ["learner"], optional: true,
   range: [0, 1], series: [["prequential_accuracy", "accuracy"]]},
  {id: "experts", title: "Experts' shares", unit: "", roles: ["learner"], optional: true,
   range: [0, 1], series: [["expert_weight_network", "network"],
                           ["expert_weight_linear_expert", "linear"]]},
  {id: "version", title: "Model version", unit: "steps", roles: ["learner"],
   series: [["model_version", "trainer"], ["serving_version", "serving"]]},
  {id: "serving", title: "Serving version", unit: "", roles: ["replica"],
   series: [["serving_version", "serving"]]},
  {id: "predictions", title: "Predictions", unit: "/s", roles: ["learner", "replica"],
   series: [["predictions_per_s", "requests/s"], ["server_errors_per_s", "server errors/s"],
            ["refused_per_s", "refused/s (429, 503, 504)"],
            ["client_errors_per_s", "client errors/s"]]},
  {id: "latency", title: "Prediction latency", unit: "ms", roles: ["learner", "replica"],
   series: [["latency_p50_ms", "p50"], ["latency_p99_ms", "p99"]]},
  {id: "batch", title: "Predict batch size", unit: "rows per model call",
   roles: ["learner", "replica"],
   series: [["predict_batch_mean", "mean"]]},
  {id: "freshness", title: "Freshness", unit: "s", roles: ["learner", "replica"],
   series: [["freshness_p50", "p50"]]},
  {id: "weights_age", title: "Weights age", unit: "s", roles: ["replica"],
   series: [["weights_age_seconds", "age"]]},
];
const TOTALS = [
  ["train_samples_total", "samples trained", ["learner"]],
  ["train_steps_total", "gradient steps", ["learner"]],
  ["predict_requests_total", "predictions", ["learner", "replica"]],
  ["predict_server_errors_total", "server errors (5xx)", ["learner", "replica"]],
  ["predict_refused_total", "refused, to retry (429, 503, 504)", ["learner", "replica"]],
  ["predict_client_errors_total", "client errors (4xx but 429)", ["learner", "replica"]],
];
const views = new Map();  // model name -> {root, history, prev}
let polls = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined || !isFinite(v)) return "\u2013";
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (a >= 1e4 || Number.isInteger(v)) return Math.round(v).toLocaleString("en-US");
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(2);
  return v.toPrecision(3);
}

function setValue(node, v) {
  node.textContent = fmt(v);
  node.dataset.value = v === null || v === undefined ? "" : String(v);
}

function rate(cur, prev, key, dt) {
  if (!prev || !(dt > 0) || cur[key] == null || prev[key] == null) return null;
  const d = cur[key] - prev[key];
  return d >= 0 ? d / dt : null;  // a restart resets counters: skip that interval
}

function derive(cur, prev, dt) {
  const ms = v => (v == null ? null : v * 1000);
  const latency = cur.predict_latency || {};
  return Object.assign({}, cur, {
    samples_per_s: rate(cur, prev, "train_samples_total", dt),
    predictions_per_s: rate(cur, prev, "predict_requests_total", dt),
    server_errors_per_s: rate(cur, prev, "predict_server_errors_total", dt),
    refused_per_s: rate(cur, prev, "predict_refused_total", dt),
    client_errors_per_s: rate(cur, prev, "predict_client_errors_total", dt),
    latency_p50_ms: ms(latency.p50), latency_p99_ms: ms(latency.p99),
  });
}

function buildView(name, role) {
  const totals = el("div", {class: "totals"});
  for (const [key, label, roles] of TOTALS) {
    if (!roles.includes(role)) continue;
    totals.append(el("div", {class: "total"}, el("span", {class: "name"}, label),
      el("span", {class: "v", "data-stat": key}, "\u2013")));
  }
  const charts = el("div", {class: "charts"});
  for (const p of PANELS) {
    if (!p.roles.includes(role)) continue;
    const legend = el("div", {class: "legend"});
    p.series.forEach(([key, label], i) => legend.append(el("span", {},
      el("span", {class: "swatch", style: "background:" + COLORS[i]}), label + " ",
      el("span", {class: "v", "data-stat": key}, "\u2013"))));
    const unit = p.unit ? el("span", {class: "unit"}, " (" + p.unit + ")") : "";
    const canvas = el("canvas", {"data-chart": p.id, "data-points": "0",
      role: "img", "aria-label": p.title});
    const panel = el("div", {class: "panel", "data-panel": p.id},
      el("h3", {}, p.title, unit), legend, canvas);
    if (p.optional) panel.hidden = true;
    charts.append(panel);
  }
  const root = el("section", {class: "model", "data-model": name},
    el("h2", {}, "model " + name), totals, charts);
  return {root, history: [], prev: null};
}

function niceStep(span) {
  const raw = span / 4, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

// The value axis: from zero (every series here is >= 0) to a round number above the maximum.
function yRange(points, keys, fixed) {
  if (fixed) return {lo: fixed[0], hi: fixed[1], step: (fixed[1] - fixed[0]) / 4};
  let lo = 0, hi = 0, seen = false;
  for (const p of points) for (const k of keys) {
    const v = p.values[k];
    if (v != null) { lo = Math.min(lo, v); hi = Math.max(hi, v); seen = true; }
  }
  if (!seen) return null;
  if (hi <= lo) hi = lo + 1;
  const step = niceStep(hi - lo);
  return {lo: Math.floor(lo / step) * step, hi: Math.ceil(hi / step) * step, step};
}

function ticks(range) {
  const decimals = Math.max(0, -Math.floor(Math.log10(range.step) + 1e-9));
  const out = [];
  for (let v = range.lo; v <= range.hi + range.step / 2; v += range.step) {
    const text = Math.abs(v) >= 1e6 ? fmt(v) : v.toLocaleString("en-US",
      {minimumFractionDigits: decimals, maximumFractionDigits: decimals});
    out.push([v, text]);
  }
  return out;
}

// The time axis grows with the history, up to WINDOW_S, so a fresh page is not one thin line.
function timeSpan(history, now) {
  const age = history.length ? now - history[0].t : 0;
  return Math.min(WINDOW_S, Math.max(30, Math.ceil(age / 10) * 10));
}

function fitCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.round(canvas.clientWidth * dpr), h = Math.round(canvas.clientHeight * dpr);
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, canvas.clientWidth, canvas.clientHeight);
  ctx.font = "11px system-ui, 'DejaVu Sans', sans-serif";
  ctx.fillStyle = "#64707d"; ctx.strokeStyle = "#e3e7eb"; ctx.lineWidth = 1;
  return ctx;
}

function drawTimeAxis(ctx, box, span, x, now) {
  const every = span <= 40 ? 10 : span <= 80 ? 20 : 30;
  ctx.textBaseline = "top";
  for (let s = 0; s <= span; s += every) {
    ctx.textAlign = s === 0 ? "right" : "center";
    ctx.fillText(s === 0 ? "now" : "\u2212" + s + " s", x(now - s), box.bottom + 4);
  }
}

function drawValueAxis(ctx, box, labels, y) {
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const [v, text] of labels) {
    const row = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(box.left, row); ctx.lineTo(box.right, row); ctx.stroke();
    ctx.fillText(text, box.left - 6, y(v));
  }
}

function drawLine(ctx, points, key, x, y, color) {
  ctx.strokeStyle = color; ctx.lineWidth = 1.8; ctx.lineJoin = "round"; ctx.beginPath();
  let pen = false;
  for (const p of points) {
    const v = p.values[key];
    if (v == null) { pen = false; continue; }  // a gap, not a drop to zero
    if (pen) ctx.lineTo(x(p.t), y(v)); else ctx.moveTo(x(p.t), y(v));
    pen = true;
  }
  ctx.stroke();
}

function drawChart(canvas, history, panel, now) {
  const ctx = fitCanvas(canvas);
  const keys = panel.series.map(s => s[0]);
  const span = timeSpan(history, now);
  const visible = history.filter(p => p.t >= now - span);
  canvas.dataset.points = String(visible.filter(p => keys.some(k => p.values[k] != null)).length);
  const range = yRange(visible, keys, panel.range);
  const labels = range ? ticks(range) : [];
  const widest = Math.max(20, ...labels.map(([, text]) => ctx.measureText(text).width));
  const box = {left: widest + 10, right: canvas.clientWidth - 4, top: 7,
               bottom: canvas.clientHeight - 18};
  const x = t => box.left + (box.right - box.left) * (1 - (now - t) / span);
  drawTimeAxis(ctx, box, span, x, now);
  if (!range) {
    ctx.textAlign = "center"; ctx.textBaseline = "middle";
    ctx.fillText("no data yet", (box.left + box.right) / 2, (box.top + box.bottom) / 2);
    return;
  }
  const y = v => box.bottom - (box.bottom - box.top) * (v - range.lo) / (range.hi - range.lo);
  drawValueAxis(ctx, box, labels, y);
  keys.forEach((k, i) => drawLine(ctx, visible, k, x, y, COLORS[i]));
}

function render(view, now) {
  const last = view.history.length ? view.history[view.history.length - 1].values : {};
  for (const node of view.root.querySelectorAll("[data-stat]")) {
    setValue(node, last[node.dataset.stat]);
  }
  for (const p of PANELS) {
    const panel = view.root.querySelector('[data-panel="' + p.id + '"]');
    if (!panel) continue;
    if (p.optional && panel.hidden) {
      panel.hidden = !view.history.some(h => p.series.some(s => h.values[s[0]] != null));
    }
    if (!panel.hidden) drawChart(panel.querySelector("canvas"), view.history, p, now);
  }
}

function update(data) {
  const main = document.getElementById("models");
  const names = Object.keys(data.models);
  if (!names.length) { main.innerHTML = '<p class="empty">No models yet.</p>'; views.clear(); }
  for (const name of names) {
    let view = views.get(name);
    if (!view) {
      if (!views.size) main.textContent = "";
      view = buildView(name, data.role);
      views.set(name, view);
      main.append(view.root);
    }
    const cur = data.models[name];
    const dt = view.prev ? data.time - view.prev.time : 0;
    view.history.push({t: data.time, values: derive(cur, view.prev && view.prev.stats, dt)});
    if (view.history.length > KEEP) view.history.shift();
    view.prev = {time: data.time, stats: cur};
    render(view, data.time);
  }
}

function setStatus(ok, text) {
  const status = document.getElementById("status");
  status.className = ok ? "ok" : "bad";
  status.textContent = text;
}

async function poll() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
  try {
    const response = await fetch("api/stats", {cache: "no-store", signal: abort.signal});
    if (!response.ok) throw new Error("HTTP " + response.status);
    const data = await response.json();
    update(data);
    polls += 1;
    document.body.dataset.polls = String(polls);
    const problems = data.problems || [];  // e.g. "MQTT broker at ... unreachable"
    if (problems.length) setStatus(false, "not ready: " + problems.join(" · "));
    else setStatus(true, "live · updated " + new Date().toLocaleTimeString());
  } catch (err) {
    setStatus(false, "no data: " + (err && err.message ? err.message : err));
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_MS);
  }
}

window.addEventListener("resize", () => {
  for (const view of views.values()) {
    const last = view.history[view.history.length - 1];
    if (last) render(view, last.t);
  }
});
poll();
</script>
</body>
</html>
"""
