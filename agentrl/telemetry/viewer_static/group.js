// The group view (#group/<source>/<i>): episode i's group, its samples side by side: reward, the advantage the
// learner recorded, status, length, where their ledgers part, and each ledger coloured by advantage on one
// scale shared by the group. Uses app.js's helpers ($, el, fmt, api, ledger, colourPicker).
"use strict";

function groupCell(source, r) {
  const link = el("a", { href: `#group/${source}/${r.i}`, title: "the group's samples side by side", text: fmt(r.group) });
  link.addEventListener("click", (ev) => ev.stopPropagation());
  const flags = [r.equal_rewards ? "=" : "", r.dropped ? "✕" : ""].join("");
  return el("td", {}, link, flags ? el("span", { cls: "flag", title: [r.equal_rewards ? "equal rewards" : "", r.dropped ? `dropped: ${r.dropped}` : ""].filter(Boolean).join(", "), text: ` ${flags}` }) : "");
}

function groupTable(g, source) {
  const head = ["sample", "reward", "advantage", "status", "turns", "tokens", `from token ${g.diverge}`];
  const rows = g.samples.map((s) => {
    const tr = el("tr", { "data-i": s.i }, el("td", { text: fmt(s.sample) }), el("td", { text: fmt(s.reward, 4) }),
      el("td", { cls: "adv", text: fmt(s.advantage, 4) }),
      el("td", { text: s.status, cls: ["ok", "truncated"].includes(s.status) ? "status-ok" : "status-bad" }),
      el("td", { text: fmt(s.turns) }), el("td", { text: `${s.generated} / ${s.tokens}` }), el("td", { cls: "part", text: s.from_diverge }));
    tr.addEventListener("click", () => { location.hash = `#episode/${source}/${s.i}`; });
    return tr;
  });
  return el("table", { id: "group-samples", cls: "grid" }, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))), el("tbody", {}, ...rows));
}

function groupLedgers(g, q) {
  // one colour scale over the group, so the samples' colours compare
  const all = g.episodes.flatMap((e) => tokenValues(e, q).finite);
  const scale = all.length ? [Math.min(...all), Math.max(...all)] : null;
  return el("div", { cls: "group-ledgers" }, ...g.episodes.map((e, k) => {
    const s = g.samples[k];
    const [legend, box] = ledger(e, q, scale);
    const at = box.querySelector(`.tk[data-i="${g.diverge}"]`);
    if (at) at.classList.add("parted");
    return el("div", { cls: "sample", "data-i": s.i }, el("h3", { text: `sample ${fmt(s.sample)} · reward ${fmt(s.reward, 3)} · advantage ${fmt(s.advantage, 3)} · ${s.status}` }), legend, box);
  }));
}

async function showGroup(source, i) {
  const t0 = performance.now();
  const g = await api(`/api/group?source=${source}&i=${i}${runParam()}`);
  const box = $("#group");
  const flags = [g.equal_rewards ? "equal rewards: no group-relative signal" : "", g.dropped ? `dropped (${g.dropped}): not trained` : ""].filter(Boolean);
  const meta = el("div", { cls: "meta" }, ...[["task", g.task_id], ["step", g.step], ["group", g.group_id], ["samples", g.samples.length],
    ["the samples part at token", `${g.diverge}${g.diverge_turn ? ` (turn ${g.diverge_turn})` : " (the prompt)"}`]].concat(g.eval ? [["eval", g.eval]] : [])
    .map(([k, v]) => el("span", {}, el("b", { text: `${k} ` }), String(v))), ...flags.map((f) => el("span", { cls: "status-bad", text: f })));
  box.replaceChildren(el("p", {}, el("a", { href: "#episodes", text: "← episodes" }), " · ", el("a", { href: `#episode/${source}/${i}`, text: "the episode" })),
    meta, groupTable(g, source), colourPicker(() => repaint(box, state.groupColour, true), "groupColour"), groupLedgers(g, state.groupColour));
  void box.offsetHeight;  // the layout too
  state.timing.group_ms = performance.now() - t0;
  document.body.dataset.groupLoaded = String(Number(document.body.dataset.groupLoaded || 0) + 1);
}
