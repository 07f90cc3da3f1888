"""Run against run (`python -m agentrl.view RUN_A RUN_B`): what the page shows of two runs beside each other,
beyond each run's own views: the config keys whose values differ, and the held-out tasks both runs
answered, each run's first and last eval of them (agentrl.telemetry.viewer_files.eval_ends).
"""

from __future__ import annotations

from typing import Any

from agentrl.telemetry.viewer_files import RunFiles, eval_ends

ABSENT = "(absent)"  # a key one config has and the other does not


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested dict down to its leaves (a list is a leaf: compared whole)."""
    if not isinstance(value, dict):
        return {prefix: value}
    if not value and prefix:
        return {prefix: {}}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_diff(configs: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The dotted keys whose values differ between the runs' configs, sorted: [{key, values}], a value
    ABSENT where that run's config lacks the key."""
    flat = [flatten(c or {}) for c in configs]
    keys = sorted(set().union(*flat))
    rows = [{"key": k, "values": [f.get(k, ABSENT) for f in flat]} for k in keys]
    return [r for r in rows if any(v != r["values"][0] for v in r["values"][1:])]


def run_config(files: RunFiles) -> dict[str, Any] | None:
    """A run's config as /api/run serves it: summary.json's, else run_config.json (a running run)."""
    return (files.summary() or {}).get("config") or files.config()


def held_out(files: RunFiles) -> dict[str, dict[str, dict[str, Any] | None]]:
    """task id -> {"before": its episode at the run's first eval, "after": at its last} (one eval only: that
    one is "after", "before" None)."""
    first, last = eval_ends(files)
    if not last:  # fewer than two evals: the one there is (if any) is the run's last
        first, last = [], files.evals.rows
    out: dict[str, dict[str, dict[str, Any] | None]] = {}
    for label, rows in (("before", first), ("after", last)):
        for r in rows:
            out.setdefault(r["task_id"], {"before": None, "after": None})[label] = r
    return out


def shared_tasks(runs: list[RunFiles]) -> list[dict[str, Any]]:
    """The held-out tasks every run answered, in the first run's order: per run its before/after rows
    (summaries, without the search text)."""
    per_run = [held_out(f) for f in runs]
    clean = lambda r: None if r is None else {k: v for k, v in r.items() if not k.startswith("_")}  # noqa: E731
    return [{"task_id": task, "runs": [{k: clean(tasks[task][k]) for k in ("before", "after")} for tasks in per_run]}
            for task in per_run[0] if all(task in tasks for tasks in per_run[1:])]


def task_answers(runs: list[RunFiles], task: str) -> list[dict[str, Any]] | None:
    """One held-out task's whole episodes per run, before and after (None where that eval lacks it); None
    when some run never answered it."""
    out = []
    for files in runs:
        rows = held_out(files).get(task)
        if rows is None:
            return None
        out.append({k: None if r is None else files.evals.record(r["i"]) for k, r in rows.items()})
    return out
