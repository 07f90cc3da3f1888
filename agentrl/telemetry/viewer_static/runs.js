// Run against run (`agentrl view RUN_A RUN_B`; #runs[/<task id>]): the config keys whose values differ, and
// a held-out task as both runs answered it, at each run's first and last eval, side by side. The overview
// overlays both runs' curves (curves.js); the episode views show the run picked in the header (run=K).
// Uses app.js's helpers ($, el, fmt, api, episodeBody, colourPicker).
"use strict";

const runParam = () => `&run=${state.runIndex}`;

// the other runs' curves (again while one is still going); the header's run picker the first time
async function loadOtherRuns() {
  const names = state.run.runs || [];
  if (names.length < 2) return;
  const others = await Promise.all(names.slice(1).map(async (_, k) => {
    const [run, got] = await Promise.all([api(`/api/run?run=${k + 1}`), api(`/api/metrics?run=${k + 1}`)]);
    return { name: names[k + 1], metrics: got.rows, evalScores: run.eval_scores, finished: Boolean(run.summary) };
  }));
  const first = !state.runs;
  state.runs = [{ name: names[0], metrics: state.metrics, evalScores: state.run.eval_scores }, ...others];
  if (!first) return;
  for (const n of document.querySelectorAll(".two-runs")) n.hidden = false;
  const pick = $("#run-pick");
  pick.replaceChildren(...names.map((n, k) => el("option", { value: String(k), text: `${"AB"[k] || k}: ${n}` })));
  pick.addEventListener("change", () => { state.runIndex = Number(pick.value); state.page = 0; route(); });
  $("#run-name").textContent = names.map((n, k) => `${"AB"[k] || k}: ${n}`).join("  vs  ");
}

function diffValue(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}

async function showRuns(task) {
  const t0 = performance.now();
  const got = await api("/api/runs");
  const names = got.names;
  $("#config-diff thead").replaceChildren(el("tr", {}, el("th", { text: "config key" }), ...names.map((n, k) => el("th", { text: `${"AB"[k]}: ${n}` }))));
  $("#config-diff tbody").replaceChildren(...(got.config_diff.length ? got.config_diff.map((d) => el("tr", { "data-key": d.key },
    el("td", { cls: "key", text: d.key }), ...d.values.map((v) => el("td", { text: diffValue(v) }))))
    : [el("tr", {}, el("td", { text: "the configs are the same" }))]));
  $("#runs-tasks thead").replaceChildren(el("tr", {}, el("th", { text: "held-out task" }),
    ...names.flatMap((n, k) => [el("th", { text: `${"AB"[k]} first eval` }), el("th", { text: `${"AB"[k]} last eval` })])));
  const reward = (r) => (r ? `${fmt(r.reward)} (${r.eval}, step ${r.step})` : "–");
  $("#runs-tasks tbody").replaceChildren(...got.tasks.map((t) => {
    const tr = el("tr", { "data-task": t.task_id }, el("td", { text: t.task_id }), ...t.runs.flatMap((r) => [el("td", { text: reward(r.before) }), el("td", { text: reward(r.after) })]));
    tr.addEventListener("click", () => { location.hash = `#runs/${encodeURIComponent(t.task_id)}`; });
    return tr;
  }));
  $("#runs-note").textContent = got.tasks.length ? `${got.tasks.length} held-out tasks answered by both runs (train.save_rollouts.eval); pick one.`
    : "the two runs recorded no held-out task in common (train.save_rollouts.eval)";
  const pair = $("#runs-pair");
  if (!task) { pair.replaceChildren(); void pair.offsetHeight; state.timing.runs_ms = performance.now() - t0; markRuns(); return; }
  const two = await api(`/api/runs/task?task=${encodeURIComponent(task)}`);
  pair.replaceChildren(...two.runs.map((r, k) => el("div", { cls: "run-col", "data-run": k },
    el("h2", { text: `${"AB"[k]}: ${names[k]}` }), k === 0 ? colourPicker(() => repaint(pair, state.colorBy)) : el("div", { cls: "legend", text: " " }),
    ...["before", "after"].flatMap((w) => (r[w] ? [el("h2", { cls: "sec", text: `${w === "before" ? "first" : "last"} eval (${r[w].eval}, step ${r[w].step})` }),
      el("div", { cls: `answer ${w}` }, ...episodeBody(r[w], state.colorBy))] : [el("p", { cls: "note", text: `no ${w === "before" ? "first" : "last"} eval of it` })])))));
  void pair.offsetHeight;  // the layout too
  state.timing.runs_ms = performance.now() - t0;
  markRuns();
}

function markRuns() {
  document.body.dataset.runsLoaded = String(Number(document.body.dataset.runsLoaded || 0) + 1);
}
