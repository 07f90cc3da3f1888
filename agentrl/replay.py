"""`python -m agentrl.replay rollouts.jsonl --config x.yaml [--out rescored.jsonl] [dotted.key=value ...]`:
saved episodes re-scored with the config's reward sources, and what changed.

Episodes saved by a run with `train.save_rollouts: true` are rebuilt (`agentrl.rollout.records`);
each one whose saved status is ok, truncated or reward_error gets back the env's own reward
(`info["env_reward"]`, which scoring keeps) and is scored again by `RewardCombiner`, exactly as
the rollout scored it. A saved "reward_error" is re-scored as "ok" (the status it had before
scoring, unless it was "truncated": the record does not say). Episodes that failed in rollout
(env_error, timeout, engine_error) are kept as they are.

Reward changes and means compare scored episodes only: an episode that a source now fails on is
a status change (`ok -> reward_error`), never a reward of 0. No engine is started (a
reward_model source loads its own model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentrl.config import ConfigError, RewardsConfig, load_config
from agentrl.data import DataError
from agentrl.rollout.records import episode_from_record, episode_to_record, read_records
from agentrl.utils.files import atomic_write
from agentrl.run.startup import input_error
from agentrl.types import TRAINABLE_STATUSES, Episode
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog

RESCORED = ("ok", "truncated", "reward_error")  # saved statuses whose episodes are scored again
MAX_CONCURRENT = 32  # episodes scored at once (each source has its own cap as well)
CHANGED = 1e-9


@dataclass
class Replayed:
    """One re-scored episode and what it was before."""

    record: dict[str, Any]
    episode: Episode
    old_reward: float
    old_status: str

    @property
    def both_scored(self) -> bool:
        return self.old_status in TRAINABLE_STATUSES and self.episode.status in TRAINABLE_STATUSES

    @property
    def delta(self) -> float:
        return self.episode.reward - self.old_reward


def reset_scoring(ep: Episode) -> None:
    """Undo what RewardCombiner.score did: the env's own reward, the status before scoring."""
    ep.reward = float(ep.info.get("env_reward", ep.reward))
    if ep.status == "reward_error":
        ep.status, ep.error = "ok", ""
    ep.info.pop("rewards", None)


def rebuild(path: str, records: list[dict[str, Any]]) -> list[Replayed]:
    out = []
    for number, record in enumerate(records, 1):
        try:
            ep = episode_from_record(record)
        except (TypeError, ValueError, KeyError) as exc:
            raise DataError(f"{path}: record {number} is not an episode ({type(exc).__name__}: {exc})") from None
        out.append(Replayed(record, ep, ep.reward, ep.status))
    return out


async def rescore(replayed: list[Replayed], rewards: RewardsConfig) -> dict[str, float]:
    """Score again every episode whose saved status is in RESCORED; returns the combiner's metrics."""
    from rewards.sources import RewardCombiner

    factory = None
    if any(s.type == "reward_model" and s.reward_model.deepspeed for s in rewards.sources):
        from agentrl.learner.models import frozen_engine as factory
    combiner = RewardCombiner(rewards, engine_factory=factory)
    sem = asyncio.Semaphore(MAX_CONCURRENT)

    async def one(ep: Episode) -> None:
        async with sem:
            reset_scoring(ep)
            await combiner.score(ep)

    try:
        async with asyncio.TaskGroup() as tg:
            for r in replayed:
                if r.old_status in RESCORED:
                    tg.create_task(one(r.episode))
        return combiner.metrics()
    finally:
        await combiner.aclose()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(replayed: list[Replayed], metrics: dict[str, float], top: int = 10) -> dict[str, Any]:
    """Counts and means of a replay (the numbers `format_summary` prints)."""
    done = [r for r in replayed if r.old_status in RESCORED]
    compared = [r for r in done if r.both_scored]
    changed = [r for r in compared if abs(r.delta) > CHANGED]
    transitions = Counter(f"{r.old_status} -> {r.episode.status}" for r in done if r.old_status != r.episode.status)
    steps = [r.record.get("step") for r in replayed if isinstance(r.record.get("step"), int)]
    largest = sorted(changed, key=lambda r: -abs(r.delta))[:top]
    return {
        "episodes": len(replayed), "rescored": len(done), "skipped": len(replayed) - len(done),
        "steps": [min(steps), max(steps)] if steps else None,
        "compared": len(compared), "rewards_changed": len(changed),
        "mean_old": _mean([r.old_reward for r in done if r.old_status in TRAINABLE_STATUSES]),
        "mean_new": _mean([r.episode.reward for r in done if r.episode.status in TRAINABLE_STATUSES]),
        "scored_old": sum(r.old_status in TRAINABLE_STATUSES for r in done),
        "scored_new": sum(r.episode.status in TRAINABLE_STATUSES for r in done),
        "status_changes": dict(sorted(transitions.items())),
        "sources": metrics,
        "largest": [{"task_id": r.episode.task_id, "step": r.record.get("step"), "old": r.old_reward,
                     "new": r.episode.reward} for r in largest],
    }


def format_summary(path: str, s: dict[str, Any]) -> str:
    steps = f", steps {s['steps'][0]}..{s['steps'][1]}" if s["steps"] else ""
    lines = ["=== agentrl replay ===",
             f"file            : {path} ({s['episodes']} episodes{steps})",
             f"re-scored       : {s['rescored']}  (kept as saved: {s['skipped']} failed in rollout)",
             f"rewards changed : {s['rewards_changed']} of {s['compared']} scored before and after",
             f"mean reward     : {s['mean_old']:.4f} -> {s['mean_new']:.4f}  "
             f"(over {s['scored_old']} -> {s['scored_new']} scored episodes)"]
    changes = s["status_changes"]
    lines.append("status changes  : " + ("; ".join(f"{k}: {n}" for k, n in changes.items()) if changes else "none"))
    by_source: dict[str, dict[str, float]] = {}
    for key, value in s["sources"].items():  # reward/<name>/<what>
        name, what = key.removeprefix("reward/").rsplit("/", 1)
        by_source.setdefault(name, {})[what] = value
    for name, m in by_source.items():
        statuses = " ".join(f"{st}={int(m[st])}" for st in ("ok", "error", "timeout") if m.get(st))
        lines.append(f"source {name:<9}: mean {m['mean']:.4f}  {statuses}  retries={int(m.get('retries', 0))}")
    if s["largest"]:
        lines.append(f"largest changes : {'task_id':<16} {'step':>6} {'old':>9} {'new':>9}")
        lines += [f"{'':18}{r['task_id']:<16} {str(r['step']):>6} {r['old']:>9.4f} {r['new']:>9.4f}"
                  for r in s["largest"]]
    return "\n".join(lines)


def write_records(path: str, replayed: list[Replayed]) -> None:
    rows = (episode_to_record(r.episode, r.record.get("step"), r.record.get("task")) for r in replayed)
    atomic_write(path, "".join(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n" for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("replay"), description=__doc__.splitlines()[0])
    parser.add_argument("rollouts", help="rollouts.jsonl written by a run with train.save_rollouts: true")
    parser.add_argument("--config", help="YAML config whose rewards section scores the episodes")
    parser.add_argument("--out", help="write the re-scored records here")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. rewards.max_retries=0")
    args = parser.parse_intermixed_args(argv)
    from rewards.sources import check_sources

    try:
        cfg = load_config(args.config, args.overrides)
        try:
            check_sources(cfg.rewards)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if args.out:
            from agentrl.utils.outputs import apart_error

            if error := apart_error(args.out, "--out", {"rollouts": args.rollouts}):
                raise ConfigError(error)
        replayed = rebuild(args.rollouts, read_records(args.rollouts))
    except ConfigError as exc:  # DataError included
        return input_error(exc)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        metrics = runner.run(rescore(replayed, cfg.rewards))
    print(format_summary(args.rollouts, summarize(replayed, metrics)))
    if args.out:
        from agentrl.utils.outputs import free_file

        out = free_file(args.out)  # never over an existing file (an earlier replay's, a run's own)
        write_records(str(out), replayed)
        print(f"re-scored records written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_and_exit(main)
