// The run viewer's page (agentrl.telemetry.viewer): plain JS, no library, no request leaves the server it
// came from. Views: #overview, #episodes, #episode/<source>/<i>, #group/<source>/<i> (group.js), #compare[/<task id>].
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v; else if (k === "cls") node.className = v; else node.setAttribute(k, v);
  }
  for (const kid of kids) node.append(kid);
  return node;
};
const fmt = (v, digits = 3) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(digits)) : String(v));
const api = async (path) => {
  const res = await fetch(path);
  if (!res.ok) throw new Error(`${path}: ${res.status} ${await res.text()}`);
  return res.json();
};

const state = { metrics: [], run: null, page: 0, limit: 50, episodeQuery: "", colorBy: "mu", groupColour: "advantage", runIndex: 0, runs: null, timing: {} };
window.viewer = state;  // the browser test and bench read timings here

// ---- overview: curves.js draws the charts ----------------------------------------------------------

async function pollMetrics() {
  const got = await api(`/api/metrics?since=${state.metrics.length}`);
  if (got.total < state.metrics.length) { state.metrics = []; return pollMetrics(); }  // the file restarted
  state.metrics.push(...got.rows);
  const bad = state.run && state.run.bad_rows ? Object.values(state.run.bad_rows).reduce((a, b) => a + b, 0) : 0;
  $("#live").textContent = `${state.metrics.length} steps` + (state.run && state.run.summary ? " · finished" : " · following") +
    (bad ? ` · ${bad} bad rows skipped` : "");
  $("#live").title = bad ? `rows skipped (not JSON objects, or fields of other types): ${JSON.stringify(state.run.bad_rows)}` : "new steps are read as the run writes them";
  return got.rows.length;
}

// ---- episodes: filters sent to the server, one page back --------------------------------------------
function filterQuery() {
  const form = new FormData($("#filters"));
  const params = new URLSearchParams();
  for (const [k, v] of form.entries()) if (k !== "st" && String(v).trim() !== "") params.set(k, String(v).trim());
  if (params.has("group_min")) params.set("group_max", params.get("group_min"));
  const statuses = [...document.querySelectorAll("#status-boxes input:checked")].map((b) => b.value);
  if (statuses.length) params.set("status", statuses.join(","));
  return params;
}

async function loadEpisodes() {
  const t0 = performance.now();
  const params = filterQuery();
  params.set("offset", String(state.page * state.limit));
  params.set("limit", String(state.limit));
  const got = await api(`/api/episodes?${params}${runParam()}`);
  drawStatuses(got.statuses);
  const source = params.get("source") || "train";
  const body = $("#episodes tbody");
  body.replaceChildren(...got.rows.map((r) => {
    const tr = el("tr", { "data-i": r.i },
      el("td", { text: fmt(r.step) }), el("td", { text: r.task_id + (r.eval ? ` (${r.eval})` : "") }), groupCell(source, r),
      el("td", { text: r.status, cls: ["ok", "truncated"].includes(r.status) ? "status-ok" : "status-bad" }),
      el("td", { text: fmt(r.reward) }), el("td", { text: fmt(r.advantage) }), el("td", { text: fmt(r.turns) }), el("td", { text: fmt(r.tool_calls) }),
      el("td", { text: fmt(r.staleness) }), el("td", { text: `${r.generated} / ${r.tokens}` }));
    tr.addEventListener("click", () => { location.hash = `#episode/${source}/${r.i}`; });
    return tr;
  }));
  const first = got.total ? got.offset + 1 : 0;
  $("#count").textContent = `${first}–${got.offset + got.rows.length} of ${got.total} (${got.all} recorded)` +
    (got.bad_rows ? ` · ${got.bad_rows} bad rows skipped` : "");
  $("#count").dataset.total = got.total;
  state.timing.filter_ms = performance.now() - t0;
  document.body.dataset.episodesLoaded = String(Number(document.body.dataset.episodesLoaded || 0) + 1);
}

function drawStatuses(counts) {
  const box = $("#status-boxes");
  const checked = new Set([...box.querySelectorAll("input:checked")].map((b) => b.value));
  const names = Object.keys(counts).sort();
  if (box.dataset.names === names.join(",")) {
    for (const n of names) box.querySelector(`input[value="${CSS.escape(n)}"]`).nextSibling.textContent = ` ${n} (${counts[n]})`;
    return;
  }
  box.dataset.names = names.join(",");
  box.replaceChildren(...names.map((n) => {
    const input = el("input", { type: "checkbox", name: "st", value: n });
    input.checked = checked.has(n);
    return el("label", {}, input, document.createTextNode(` ${n} (${counts[n]})`));
  }));
}

let filterTimer = null;
function onFilter() {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(() => { state.page = 0; loadEpisodes(); }, 120);
}

// ---- one episode: the conversation, then the ledger token by token ----------------------------------
const QUANTITIES = {
  mu: ["behaviour log-prob μ", (e, i) => (e.loss_mask[i] ? e.logprobs[i] : null)],
  prob: ["behaviour prob exp(μ)", (e, i) => (e.loss_mask[i] && e.logprobs[i] !== null ? Math.exp(e.logprobs[i]) : null)],
  version: ["policy version", (e, i) => (e.loss_mask[i] && e.versions[i] >= 0 ? e.versions[i] : null)],
  staleness: ["staleness (step − version)", (e, i) => e.staleness[i]],
  masked: ["trained (loss mask)", (e, i) => e.loss_mask[i]],
  advantage: ["advantage", (e, i) => (e.advantages ? e.advantages[i] : null)],
  pimu: ["π − μ (learner − behaviour log-prob)", (e, i) => (e.learner_logprobs && e.learner_logprobs[i] !== null && e.logprobs[i] !== null ? e.learner_logprobs[i] - e.logprobs[i] : null)],
  trust: ["trust region: kept (1) or masked out (0)", (e, i) => (e.trust_kept ? e.trust_kept[i] : null)],
};

// what the trust region decided for token i, in words (null: not recorded)
function trustWord(e, i) {
  if (!e.trust_kept || e.trust_kept[i] === null || e.trust_kept[i] === undefined) return null;
  return e.trust_kept[i] ? "kept" : "masked out";
}

function colour(q, v, lo, hi) {
  if (v === null || v === undefined) return "";
  if (q === "masked") return v ? "hsl(220 80% 86%)" : "";
  if (q === "trust") return v ? "hsl(140 45% 88%)" : "hsl(0 80% 62%)";  // a masked-out token must stand out
  if (q === "cause") return causeColour(v);  // causes.js
  const t = hi > lo ? (v - lo) / (hi - lo) : 0.5;  // 0..1 across the episode's range
  if (q === "advantage" || q === "pimu") {
    // Diverging around 0, scaled by the episode's largest |value|; pi - mu at least 0.1 nats full scale, so
    // float noise between engine and learner (1e-5) stays white instead of filling the scale.
    const scale = Math.max(Math.abs(lo), Math.abs(hi), q === "pimu" ? 0.1 : 1e-9);
    return `hsl(${v >= 0 ? "140 60%" : "0 75%"} ${92 - 36 * Math.min(1, Math.abs(v) / scale)}%)`;
  }
  if (q === "staleness") return `hsl(${120 - 120 * t} 70% 78%)`;
  if (q === "version") return `hsl(${200 + 80 * t} 60% 82%)`;
  return `hsl(${120 * t} 70% 78%)`;  // mu, prob: red = unlikely under the behaviour policy, green = likely
}

function tokenText(e, i) {
  const t = e.token_text ? e.token_text[i] : `⟨${e.tokens[i]}⟩`;
  return t === "" ? "∅" : t;
}

// the finite values of quantity q over episode e's tokens, and their range
function tokenValues(e, q) {
  const values = e.tokens.map((_, i) => QUANTITIES[q][1](e, i));
  const finite = values.filter((v) => typeof v === "number" && isFinite(v));
  return { values, finite, lo: Math.min(...finite), hi: Math.max(...finite) };
}

const escapeHtml = (t) => t.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

// Episode e's ledger, token by token: the spans built as one string (an episode has thousands), then
// coloured by quantity q (`paint`). Returns [legend, box]; the box keeps its episode and spans for a repaint.
function ledger(e, q, scale = null) {
  const box = el("div", { cls: "ledger" });
  const starts = new Map((e.turns || []).map((t, k) => [t.start, k]));
  const parts = [];
  for (let i = 0; i < e.tokens.length; i++) {
    if (starts.has(i)) parts.push(`<span class="turn">turn ${starts.get(i) + 1}</span>`);
    parts.push(`<span class="tk ${e.loss_mask[i] ? "gen" : "ctx"}" data-i="${i}">${escapeHtml(tokenText(e, i))}</span>`);
  }
  box.innerHTML = parts.join("");
  box.episode = e;
  box.spans = Array.from(box.getElementsByClassName("tk"));
  box.legend = el("div", { cls: "legend" });
  box.addEventListener("mouseover", (ev) => showTip(ev, e, box.dataset.q));
  box.addEventListener("mouseout", () => { $("#tip").hidden = true; });
  paint(box, q, scale);
  return [box.legend, box];
}

// colours a ledger's tokens by quantity q and says so in its legend; scale: [lo, hi] shared by several
// ledgers (a group's samples), else the episode's own range
function paint(box, q, scale = null) {
  const e = box.episode;
  const { values, finite, lo: ownLo, hi: ownHi } = tokenValues(e, q);
  const [lo, hi] = scale || [ownLo, ownHi];
  box.dataset.q = q;
  for (let i = 0; i < box.spans.length; i++) box.spans[i].style.background = colour(q, values[i], lo, hi);
  box.legend.replaceChildren(el("span", { text: `colour: ${QUANTITIES[q][0]}` }),
    finite.length && q === "cause" ? causeLegend(finite) : el("span", { text: !finite.length ? "(not recorded for this episode)"
      : q === "trust" ? `${finite.filter((v) => !v).length} of ${finite.length} trained tokens masked out`
      : `from ${fmt(ownLo)} to ${fmt(ownHi)}` + (scale ? ` (colours: the group's ${fmt(lo)} to ${fmt(hi)})` : "") }));
}

// every ledger under `root` coloured by q again (shared: on one scale over all of them, as the group view's);
// the layout read back too, so the time taken is what a user waits for (bench/viewer.py)
function repaint(root, q, shared = false) {
  const t0 = performance.now();
  const boxes = [...root.querySelectorAll(".ledger")].filter((b) => b.episode);
  let scale = null;
  if (shared) {
    const all = boxes.flatMap((b) => tokenValues(b.episode, q).finite);
    scale = all.length ? [Math.min(...all), Math.max(...all)] : null;
  }
  for (const b of boxes) paint(b, q, scale);
  void root.offsetHeight;
  state.timing.colour_ms = performance.now() - t0;
  document.body.dataset.episodeDrawn = String(Number(document.body.dataset.episodeDrawn || 0) + 1);
}

function showTip(ev, e, q) {
  const span = ev.target.closest(".tk");
  const tip = $("#tip");
  if (!span) { tip.hidden = true; return; }
  const i = Number(span.dataset.i);
  const lines = [`#${i} ${JSON.stringify(tokenText(e, i))} id ${e.tokens[i]}`,
    `${QUANTITIES[q][0]}: ${q === "cause" ? causeWord(e, i) || "–" : fmt(QUANTITIES[q][1](e, i), 4)}`];
  if (e.loss_mask[i]) {
    lines.push(`μ ${fmt(e.logprobs[i], 4)}  version ${e.versions[i]}  staleness ${fmt(e.staleness[i])}`);
    if (e.advantages || e.learner_logprobs) lines.push(`advantage ${fmt(e.advantages ? e.advantages[i] : null, 4)}  learner π ${fmt(e.learner_logprobs ? e.learner_logprobs[i] : null, 4)}`);
    if (trustWord(e, i)) lines.push(`trust region: ${trustWord(e, i)}`);
    if (causeWord(e, i)) lines.push(`why: ${causeWord(e, i)}`);
  } else lines.push("context (prompt, env or tool reply): not trained");
  tip.textContent = lines.join("\n");
  tip.dataset.i = String(i);
  tip.hidden = false;
  const r = span.getBoundingClientRect();
  tip.style.left = `${Math.min(r.left, innerWidth - 360)}px`;
  tip.style.top = `${r.bottom + 6}px`;
}

function conversation(e) {
  return (e.messages || []).map((m) => {
    const parts = [el("span", { cls: "role", text: m.role + (m.name ? ` · ${m.name}` : "") })];
    if (m.content) parts.push(document.createTextNode(typeof m.content === "string" ? m.content : JSON.stringify(m.content)));
    for (const call of m.tool_calls || []) parts.push(el("div", { cls: "call", text: `→ ${JSON.stringify(call.function || call)}` }));
    return el("div", { cls: `msg ${m.role}` }, ...parts);
  });
}

function rewardTable(e) {
  const rows = Object.entries((e.info && e.info.rewards) || {}).map(([name, r]) =>
    el("tr", {}, el("td", { text: name }), el("td", { text: fmt(r.value, 4) }), el("td", { text: r.status }), el("td", { text: r.error || "" })));
  if (e.info && "env_reward" in e.info) rows.unshift(el("tr", {}, el("td", { text: "env (its own)" }), el("td", { text: fmt(e.info.env_reward, 4) }), el("td"), el("td")));
  return el("table", { cls: "rewards" }, el("tr", {}, el("th", { text: "source" }), el("th", { text: "value" }), el("th", { text: "status" }), el("th")), ...rows);
}

function episodeBody(e, q, wide) {
  const meta = el("div", { cls: "meta" }, ...[["task", e.task_id], ["step", e.step], ["group", e.group_id], ["sample", e.sample],
    ["status", e.status], ["reward", fmt(e.reward, 4)], ["success", String(e.success)], ["turns", (e.turns || []).length],
    ["tokens", `${e.loss_mask.reduce((a, b) => a + b, 0)} generated / ${e.tokens.length}`]].concat(e.eval ? [["eval", e.eval]] : [])
    .map(([k, v]) => el("span", {}, el("b", { text: `${k} ` }), String(v))));
  const left = [el("h2", { cls: "sec", text: "Rewards" }), rewardTable(e)];
  if (e.error || e.traceback) left.push(el("h2", { cls: "sec", text: "Error" }), el("pre", { cls: "error", text: [e.error, e.traceback].filter(Boolean).join("\n\n") }));
  left.push(el("h2", { cls: "sec", text: "Conversation" }), ...conversation(e));
  const right = [el("h2", { cls: "sec", text: "Tokens" }), ...ledger(e, q),
    el("details", {}, el("summary", { text: "task and info" }), el("pre", { text: JSON.stringify({ task: e.task, info: e.info }, null, 2) }))];
  return wide ? [meta, el("div", { cls: "pair" }, el("div", {}, ...left), el("div", {}, ...right))] : [meta, ...left, ...right];
}

// key: the state field the choice is kept in (the group view keeps its own, advantage first)
function colourPicker(onChange, key = "colorBy") {
  const select = el("select", { id: "colour-by" }, ...Object.entries(QUANTITIES).map(([k, [label]]) => el("option", { value: k, text: label })));
  select.value = state[key];
  select.addEventListener("change", () => { state[key] = select.value; onChange(); });
  return el("label", { cls: "legend" }, "colour tokens by ", select);
}

async function showEpisode(source, i) {
  const e = await api(`/api/episode?source=${source}&i=${i}${runParam()}`);
  const box = $("#episode");
  const t0 = performance.now();
  box.replaceChildren(el("p", {}, el("a", { href: "#episodes", text: "← episodes" }), " · ",
    el("a", { href: `#group/${source}/${i}`, id: "to-group", text: "its group side by side →" })),
  colourPicker(() => repaint(box, state.colorBy)), ...episodeBody(e, state.colorBy, true));
  void box.offsetHeight;  // the layout too: what a user waits for (bench/viewer.py)
  state.timing.colour_ms = performance.now() - t0;
  document.body.dataset.episodeDrawn = String(Number(document.body.dataset.episodeDrawn || 0) + 1);
}

// ---- before / after: one held-out task at the first and the last eval --------------------------------
async function showCompare(task) {
  const got = await api(`/api/compare?${runParam().slice(1)}`);
  $("#compare-note").textContent = got.tasks.length ? `${got.tasks.length} held-out tasks answered at both the first and the last eval (train.save_rollouts.eval); pick one.`
    : "this run recorded no two evals of the held-out tasks (train.save_rollouts.eval, with train.eval_before / eval_after)";
  $("#compare-list tbody").replaceChildren(...got.tasks.map((p) => {
    const tr = el("tr", {}, el("td", { text: p.task_id }), el("td", { text: `${fmt(p.before.reward)} (${p.before.eval}, step ${p.before.step})` }),
      el("td", { text: `${fmt(p.after.reward)} (${p.after.eval}, step ${p.after.step})` }));
    tr.addEventListener("click", () => { location.hash = `#compare/${encodeURIComponent(p.task_id)}`; });
    return tr;
  }));
  const pair = $("#compare-pair");
  if (!task) { pair.replaceChildren(); return; }
  const two = await api(`/api/compare?task=${encodeURIComponent(task)}${runParam()}`);
  pair.replaceChildren(...["before", "after"].map((k) => el("div", {}, el("h2", { text: `${k === "before" ? "first" : "last"} eval (${two[k].eval}, step ${two[k].step})` }),
    k === "before" ? colourPicker(() => repaint(pair, state.colorBy)) : el("div", { cls: "legend", text: " " }), ...episodeBody(two[k], state.colorBy))));
  $("#compare-list").scrollIntoView();
}

// ---- routing and start ---------------------------------------------------------------------------
async function route() {
  const [view, a, b] = (location.hash.slice(1) || "overview").split("/");
  const name = { episode: "episode", group: "group" }[view] || (["overview", "episodes", "compare", "runs"].includes(view) ? view : "overview");
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("on", s.id === `view-${name}`);
  for (const n of document.querySelectorAll("nav a")) n.classList.toggle("on", n.dataset.view === (["episode", "group"].includes(name) ? "episodes" : name));
  if (name === "overview") drawOverview();
  else if (name === "episodes") await loadEpisodes();
  else if (name === "episode") await showEpisode(a, b);
  else if (name === "group") await showGroup(a, b);
  else if (name === "runs") await showRuns(a ? decodeURIComponent(a) : null);
  else await showCompare(a ? decodeURIComponent(a) : null);
  document.body.dataset.view = location.hash || "#overview";
}

async function start() {
  const t0 = performance.now();
  state.run = await api("/api/run");
  $("#run-name").textContent = state.run.name;
  $("#summary").textContent = state.run.summary ? JSON.stringify(state.run.summary, null, 2) : "no summary.json yet: the run is still going";
  $("#config").textContent = state.run.config ? JSON.stringify(state.run.config, null, 2) : "written to summary.json at the end of the run";
  await pollMetrics();
  await loadOtherRuns();
  for (const input of document.querySelectorAll("#filters input[type=text], #filters input:not([type])")) input.addEventListener("input", onFilter);
  $("#filters").addEventListener("change", () => { clearTimeout(filterTimer); state.page = 0; loadEpisodes(); });
  $("#filters").addEventListener("submit", (ev) => ev.preventDefault());
  $("#prev").addEventListener("click", () => { if (state.page > 0) { state.page--; loadEpisodes(); } });
  $("#next").addEventListener("click", () => { if ((state.page + 1) * state.limit < Number($("#count").dataset.total || 0)) { state.page++; loadEpisodes(); } });
  addEventListener("hashchange", route);
  await route();
  state.timing.open_ms = performance.now();  // since navigation start: what a user waits for
  state.timing.start_ms = performance.now() - t0;
  document.body.dataset.ready = "1";
  setInterval(async () => {  // follow a running run: new steps redraw the curves
    if (state.runs && state.runs.some((r) => r.finished === false)) await loadOtherRuns();
    if (state.run.summary) return;
    if ((await pollMetrics()) && document.body.dataset.view === "#overview") drawOverview();
    if (state.metrics.length && !state.run.summary) state.run = await api("/api/run");
  }, 3000);
}

// after every script of the page (group.js) is read
addEventListener("DOMContentLoaded", () => start().catch((err) => { document.body.prepend(el("pre", { cls: "status-bad", text: String(err) })); }));
