"""A learner step's line of metrics.jsonl (`agentrl.telemetry.metrics` names its keys): the batch's episodes and
staleness, the learner's step metrics, the weight pushes, the rollout pool's tools and scorer, the buffer."""

from __future__ import annotations

import time
from typing import Any

from agentrl.rollout.pool import RolloutPool
from agentrl.run.buffer import BatchAssembly, StalenessBuffer
from agentrl.telemetry.tool_use import tool_use_metrics


def step_record(step: int, assembly: BatchAssembly, metrics: list, pushes: list, pool: RolloutPool,
                window: dict[str, float], overlap_tokens: int, buffer: StalenessBuffer) -> dict[str, Any]:
    episodes = assembly.episodes
    now = time.perf_counter()
    tokens_per_s = (pool.generated_tokens - window["tokens"]) / max(now - window["time"], 1e-9)
    window.update(tokens=pool.generated_tokens, time=now)
    hist = assembly.staleness_hist
    # loss and grad_norm, like policy/* below, from the batch's last step that trained the actor (a step
    # learner.target_kl stops has no share of tokens, a loss of 0 and no norm); every step if none did
    last = ([m for m in metrics if m.share] or metrics)[-1]
    rec: dict[str, Any] = {
        "step": step, "version": step + 1, "episodes": len(episodes),
        "reward_mean": sum(e.reward for e in episodes) / len(episodes),
        "success_rate": sum(e.success for e in episodes) / len(episodes),
        "staleness_hist": hist, "staleness_max": max(hist) if hist else 0,
        "rollout_tokens_per_s": tokens_per_s, "learner_step_s": sum(m.step_time_s for m in metrics),
        "loss": last.loss, "grad_norm": last.grad_norm, "overlap_tokens": overlap_tokens,
        "push_latency_s": max((p.latency_s for p in pushes if p.ok), default=None),
        "push_pause_s": max((p.pause_s for p in pushes if p.ok), default=None),
        "push_snapshot_s": max((p.snapshot_s for p in pushes if p.ok), default=None),
        "push_failures": sum(not p.ok for p in pushes), "dropped_stale": assembly.dropped_stale,
    }
    # each key from the batch's last optimizer step that has it (a step learner.target_kl skips has no pass)
    rec.update({f"policy/{k}": v for m in metrics for k, v in m.policy.items()})
    if metrics[-1].critic_loss is not None:
        rec["policy/critic/loss"] = metrics[-1].critic_loss
    if len(metrics) > 1:  # several optimizer steps a batch: each one's own, as it reported them
        rec["policy_steps"] = [m.policy for m in metrics]
    rec.update({f"episodes/{k}": v for k, v in pool.status_counts.items()})
    rec.update(pool.tool_stats.metrics())
    rec.update(tool_use_metrics(rec))
    if pool.scorer is not None:
        rec.update(pool.scorer.metrics())
    if pool.spec.server is not None:
        rec.update(pool.spec.server.stats())
    rec.update({f"buffer/{k}": v for k, v in buffer.stats().items()})
    return rec
