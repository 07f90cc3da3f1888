"""A group as `agentrl.view` shows it: the samples of one task at one step side by side (GRPO's signal is
the spread of rewards inside a group), and the group-level facts the episode list filters on.

A group is the episodes of one file that share (step, group id, eval label, dropped reason): a trained
group's episodes are written together by the run's writer (agentrl.rollout.records.RolloutWriter.write),
a group the dynamic filter dropped is written with `dropped: "filtered"` (`write_dropped`).
"""

from __future__ import annotations

from typing import Any

TRAINABLE = ("ok", "truncated")  # agentrl.types.TRAINABLE_STATUSES, as the list's rows spell a status
PREVIEW_TOKENS = 16  # of each sample's text from where the samples part


def group_key(row: dict[str, Any]) -> tuple:
    return row["step"], row["group"], row["eval"], row["dropped"]


def equal_rewards(rows: list[dict[str, Any]]) -> bool:
    """Whether the group's trainable episodes (at least two) all got the same reward: a group-relative
    advantage is zero on every token of them (agentrl.telemetry.learning_signal counts these groups)."""
    rewards = {r["reward"] for r in rows if r["status"] in TRAINABLE and r["reward"] is not None}
    return sum(r["status"] in TRAINABLE for r in rows) >= 2 and len(rewards) == 1


def mark(rows: list[dict[str, Any]], members: dict[tuple, list[int]], new: list[dict[str, Any]]) -> None:
    """Adds the `new` rows (already in `rows`) to their groups and sets `equal_rewards` on every row of a
    group they joined."""
    touched = set()
    for row in new:
        key = group_key(row)
        members.setdefault(key, []).append(row["i"])
        touched.add(key)
    for key in touched:
        same = equal_rewards([rows[i] for i in members[key]])
        for i in members[key]:
            rows[i]["equal_rewards"] = same


def divergence(records: list[dict[str, Any]]) -> int:
    """The first token position where the samples' ledgers differ (the length of their common prefix:
    the prompt, and whatever they generated alike)."""
    if not records:
        return 0
    ledgers = [r.get("tokens") or [] for r in records]
    n = min(len(t) for t in ledgers)
    first = ledgers[0]
    for k in range(n):
        if any(t[k] != first[k] for t in ledgers[1:]):
            return k
    return n


def advantage(record: dict[str, Any]) -> float | None:
    """The advantage the learner weighed the episode's tokens by (`advantages` beside its ledger), as one
    number: their mean over scored tokens (GRPO gives every token of an episode the same); None when the
    record has none (a failure the batch left out, a dropped group, an older run)."""
    values = [v for v in record.get("advantages") or [] if isinstance(v, (int, float))]
    return round(sum(values) / len(values), 4) if values else None


def turn_at(record: dict[str, Any], k: int) -> int | None:
    """The 1-based turn a token position falls in (None: the prompt)."""
    turn = None
    for n, t in enumerate(record.get("turns") or []):
        if isinstance(t, dict) and isinstance(t.get("start"), int) and t["start"] <= k:
            turn = n + 1
    return turn


def sample_row(i: int, record: dict[str, Any], diverge: int) -> dict[str, Any]:
    """One sample of the group, as the group view's table shows it."""
    text = record.get("token_text") or [f"⟨{t}⟩" for t in record.get("tokens") or []]
    return {"i": i, "sample": record.get("sample"), "reward": record.get("reward"), "status": record.get("status"),
            "advantage": advantage(record), "turns": len(record.get("turns") or []),
            "tokens": len(record.get("tokens") or []), "generated": sum(record.get("loss_mask") or []),
            "from_diverge": "".join(text[diverge:diverge + PREVIEW_TOKENS])}


def group_view(rows: list[dict[str, Any]], members: dict[tuple, list[int]], i: int,
               read: Any) -> dict[str, Any] | None:
    """The group of episode `i`: its samples' rows and whole records (`read(i)`), where they part, and
    whether their rewards are equal; None when `i` is not an episode of the index."""
    if not 0 <= i < len(rows):
        return None
    row = rows[i]
    ids = members.get(group_key(row), [i])
    records = [read(j) for j in ids]
    if any(r is None for r in records):
        return None
    diverge = divergence(records)
    return {"step": row["step"], "group_id": row["group"], "task_id": row["task_id"], "eval": row["eval"],
            "dropped": row["dropped"], "equal_rewards": equal_rewards([rows[j] for j in ids]), "diverge": diverge,
            "diverge_turn": turn_at(records[0], diverge),
            "samples": [sample_row(j, r, diverge) for j, r in zip(ids, records)], "episodes": records}
