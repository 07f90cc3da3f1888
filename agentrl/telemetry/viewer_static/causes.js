// Why each token was or was not trained, as the learner recorded it (`cause` beside a trained episode's
// ledger: agentrl/learner/token_record.py), shown on hover and as a colouring. CAUSES is
// agentrl/algo/correction.py's TOKEN_CAUSES, index = code (tests/test_viewer_causes.py holds them equal);
// code 8 is the page's own: the episode's whole group was dropped (its record says `dropped`), nothing of it trained.
"use strict";

const CAUSES = [
  "kept", "masked: trust region, A < 0 side", "masked: trust region, A > 0 side", "masked: trust region",
  "kept: importance weight capped", "masked: importance weight zeroed", "not trained: target_kl stopped the step",
  "not trained: the actor was frozen",
];
const DROPPED = 8;
const CAUSE_COLOURS = ["hsl(140 45% 86%)", "hsl(0 80% 62%)", "hsl(28 95% 60%)", "hsl(300 55% 68%)", "hsl(52 95% 68%)",
  "hsl(262 60% 70%)", "hsl(220 10% 72%)", "hsl(200 30% 76%)", "hsl(0 0% 58%)"];

QUANTITIES.cause = ["why trained or not (the learner's cause)", (e, i) => {
  if (!e.loss_mask[i]) return null;
  if (e.dropped) return DROPPED;
  return e.cause && typeof e.cause[i] === "number" ? e.cause[i] : null;
}];

function causeColour(v) {
  return CAUSE_COLOURS[v] || "";
}

// token i's cause in words (null: not recorded, or a context token)
function causeWord(e, i) {
  const v = QUANTITIES.cause[1](e, i);
  if (v === null) return null;
  if (v !== DROPPED) return CAUSES[v] || `cause ${v}`;
  const oldest = Math.max(...(e.staleness || []).filter((s) => typeof s === "number"));
  return e.dropped === "stale" ? `not trained: the whole group was dropped as too stale (staleness ${isFinite(oldest) ? oldest : "?"} at step ${e.step})`
    : e.dropped === "filtered" ? "not trained: the whole group was dropped by the dynamic filter (equal rewards)"
    : `not trained: the whole group was dropped (${e.dropped})`;
}

// the legend of the cause colouring: each cause present, its swatch and count
function causeLegend(values) {
  const counts = new Map();
  for (const v of values) counts.set(v, (counts.get(v) || 0) + 1);
  return el("span", { cls: "causes" }, ...[...counts.keys()].sort((a, b) => a - b).map((v) => el("span", { cls: "cause", "data-cause": v },
    el("i", { style: `background:${causeColour(v)}` }), `${v === DROPPED ? "group dropped" : CAUSES[v]}: ${counts.get(v)}`)));
}
