// The overview's charts (agentrl.telemetry.viewer): one small SVG per curve the run has, one line per run
// (two runs: overlaid on one axis, a legend with their folder names). The held-out score is drawn as
// curves.png draws it (agentrl/telemetry/plot.py): on the axis of updates applied, from the warm start's score
// before RL (at 0) through the in-run evals (a record's at step s follows update s: s + 1) to the score
// after RL. A curve that never changes folds away to one line ("constant: <value>"), expandable.
"use strict";

const CURVES = [
  ["reward_mean", "reward (trained batch)"], ["eval_score", "held-out eval score"], ["success_rate", "success rate"],
  ["staleness_max", "staleness, max"], ["trained_staleness_max", "staleness trained, max"], ["policy/kl", "KL to reference"],
  ["policy/mismatch_k1", "KL(mu || pi), k1"], ["policy/trust_masked_frac", "trust-masked share"],
  ["push_pause_s", "push pause (s)"], ["rollout_tokens_per_s", "rollout tokens / s"], ["tools/call_success_rate", "tool-call success"],
  ["tools/calls_per_turn", "tool calls / turn"], ["policy/entropy", "entropy"], ["policy/padding_ratio", "padding ratio (run / real tokens)"],
  ["learner_step_s", "learner step (s)"],
];
const RUN_COLOURS = ["#3056d3", "#d9480f"];

function curveKeys(runs) {
  const present = new Set();
  for (const run of runs) for (const r of run.metrics) for (const [k, v] of Object.entries(r)) if (typeof v === "number") present.add(k);
  const keys = CURVES.filter(([k]) => present.has(k));
  for (const k of present) if (/padding/.test(k) && !keys.some(([x]) => x === k)) keys.push([k, k]);
  return keys;
}

// [x, y, what a hover says] of one run's curve
function curvePoints(key, run) {
  const rows = run.metrics.filter((r) => typeof r[key] === "number" && typeof r.step === "number");
  if (key !== "eval_score") return rows.map((r) => [r.step, r[key], `step ${r.step}: ${fmt(r[key], 4)}`]);
  const pts = rows.map((r) => [r.step + 1, r[key], `after update ${r.step + 1} (step ${r.step}): ${fmt(r[key], 4)}`]);
  const scores = run.evalScores || {};
  if (typeof scores.before === "number") pts.unshift([0, scores.before, `before RL (the warm start): ${fmt(scores.before, 4)}`]);
  const steps = run.metrics.filter((r) => typeof r.step === "number");
  if (typeof scores.after === "number" && steps.length) {
    pts.push([steps[steps.length - 1].step + 1, scores.after, `after RL: ${fmt(scores.after, 4)}`]);
  }
  return pts;
}

function chart(key, label, runs) {
  const series = runs.map((run, k) => ({ name: run.name, colour: RUN_COLOURS[k % RUN_COLOURS.length], pts: curvePoints(key, run) }));
  const all = series.flatMap((s) => s.pts);
  const W = 320, H = 140, L = 38, R = 6, T = 6, B = 16;
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const constant = all.length > 1 && y0 === y1;
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("data-key", key);
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n);
    return n;
  };
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" });
  add("text", { x: L - 4, y: T + 8, "text-anchor": "end", class: "lbl" }, fmt(y1, 2));
  add("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "lbl" }, fmt(y0, 2));
  add("text", { x: L, y: H - 3, class: "lbl" }, `${key === "eval_score" ? "update" : "step"} ${fmt(x0)}`);
  add("text", { x: W - R, y: H - 3, "text-anchor": "end", class: "lbl" }, `${fmt(x1)}`);
  for (const [k, s] of series.entries()) {
    add("polyline", { points: s.pts.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "), stroke: s.colour, "data-run": k });
    const r = s.pts.length > 60 ? 1.3 : 2.4;
    for (const [x, y, what] of s.pts) add("circle", { cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r, class: "pt", fill: s.colour, "data-run": k }).append(
      Object.assign(document.createElementNS(NS, "title"), { textContent: series.length > 1 ? `${s.name}: ${what}` : what }));
  }
  const last = (s) => (s.pts.length ? s.pts[s.pts.length - 1][1] : null);
  const note = series.length > 1
    ? el("span", { cls: "runs" }, ...series.map((s) => el("span", { cls: "run" }, el("i", { style: `background:${s.colour}` }), `${s.name} ${fmt(last(s))}`)))
    : el("span", { text: `last ${fmt(last(series[0]))} · ${series[0].pts.length} pts` });
  if (!constant) return el("div", { cls: "chart", "data-key": key }, el("h3", {}, label, note), svg);
  // constant over the run (every run shown): one line, the chart on demand
  return el("details", { cls: "chart folded", "data-key": key }, el("summary", {}, label, el("span", { cls: "const", text: `constant: ${fmt(all[0][1], 4)} · ${all.length} pts` })), svg);
}

// state.runs: the run (and in run-against-run mode the second one) as {name, metrics, evalScores}
function drawOverview() {
  const box = $("#charts");
  if (state.runs) state.runs[0].metrics = state.metrics;  // pollMetrics may have started it anew
  const runs = state.runs || [{ name: state.run ? state.run.name : "", metrics: state.metrics, evalScores: state.run && state.run.eval_scores }];
  const charts = curveKeys(runs).map(([k, label]) => chart(k, label, runs));
  charts.sort((a, b) => (a.tagName === "DETAILS") - (b.tagName === "DETAILS"));  // folded ones last
  box.replaceChildren(...charts);
  if (!runs.some((r) => r.metrics.length)) box.append(el("p", { cls: "note", text: "no steps yet: metrics.jsonl is empty" }));
}
