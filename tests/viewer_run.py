"""A small run folder for the viewer's tests and bench: episodes built by hand, written by the run's own
writers (agentrl.rollout.records.RolloutWriter: rollouts.jsonl, eval_episodes.jsonl; MetricsSink:
metrics.jsonl, summary.json), so the files are byte for byte what a run writes."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from agentrl.algo import behaviour_trust_mask, importance_weights, token_causes
from agentrl.config.algo import ClipTrustRegion, MaskCorrection
from agentrl.rollout.records import RolloutWriter
from agentrl.telemetry.metrics import MetricsSink
from agentrl.types import Episode, Group, Turn

STATUSES = ("ok", "ok", "ok", "truncated", "env_error", "timeout")


def decode(ids: list[int]) -> list[str]:
    """A stand-in tokenizer: token id n reads as a word, ids below 10 as markup."""
    return [f"<m{t}>" if t < 10 else f" w{t}" for t in ids]


def episode(rng: random.Random, step: int, group: int, sample: int, turns: int) -> Episode:
    """`turns` model turns, each followed by an env reply; the generated tokens sampled at versions
    step - 0..2, behaviour logprobs in (-4, 0)."""
    status = STATUSES[rng.randrange(len(STATUSES))]
    ep = Episode(task_id=f"task-{group}", group_id=group, sample=sample, status=status,
                 reward=round(rng.uniform(-1, 1), 3), success=rng.random() < 0.5)
    ep.messages = [{"role": "user", "content": f"question {group} about apples"}]
    ep.append([1, 11, 12 + group % 50, 2], generated=False)
    ep.prompt_len = len(ep.tokens)
    calls = 0
    for k in range(turns):
        n = rng.randint(2, 6)
        version = max(0, step - rng.randint(0, 2))
        start = len(ep.tokens)
        ep.append([rng.randint(10, 300) for _ in range(n)], generated=True,
                  logprobs=[-round(rng.uniform(0.01, 4), 4) for _ in range(n)], versions=[version] * n)
        ep.turns.append(Turn(start=start, n_generated=n, text=f"answer {k}"))
        ep.messages.append({"role": "assistant", "content": f"answer {k}"})
        calls += k % 2
        reply = [3, 20 + k, 4]
        ep.append(reply, generated=False)
        ep.turns[-1].env_tokens = len(reply)
        ep.messages.append({"role": "user", "content": f"reply {k}"})
    ep.info = {"tool_calls": calls, "env_reward": ep.reward, "rewards": {"env": {"value": ep.reward, "status": "ok"}}}
    if status == "env_error":
        ep.error, ep.traceback = "env raised ValueError", "Traceback (most recent call last):\n  ValueError"
    return ep


def grpo_advantage(ep: Episode, trained: list[Episode]) -> float:
    """GRPO's advantage of `ep`: its reward less its group's mean over the trained episodes, over their std
    (population; 1e-6 apart), rounded to 3 decimals: 0 on a group whose rewards are equal."""
    rewards = [e.reward for e in trained if e.group_id == ep.group_id]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return round((ep.reward - mean) / (std + 1e-6), 3)


def learner_tensors(rng: random.Random, trained: list[Episode]) -> dict[str, torch.Tensor]:
    """(B, T) per-token values as the learner returns them (`StepMetrics.token_values`): GRPO's advantage per
    row, log pi = mu + a drift in (-0.5, 0.5) on scored tokens, the shipped trust region's decision on
    them (clip at mu, eps 0.2: a drift below log 0.8 with A < 0 or above log 1.2 with A > 0 is masked out),
    and each token's cause as the loss gives it (`token_causes`: that trust region first, then a mask
    correction on w = pi / mu, pi_prox being log pi, outside [0.7, 1.4] zeroed)."""
    T = max(len(e.tokens) for e in trained)
    adv, logp = torch.zeros(len(trained), T), torch.zeros(len(trained), T)
    for b, e in enumerate(trained):
        mask = torch.tensor(e.loss_mask, dtype=torch.float)
        adv[b, :len(e.tokens)] = grpo_advantage(e, trained) * mask
        drift = torch.tensor([rng.uniform(-0.5, 0.5) for _ in e.tokens])
        logp[b, :len(e.tokens)] = (torch.tensor(e.logprobs) + drift) * mask
    mu, mask = torch.zeros_like(logp), torch.zeros_like(logp)
    for b, e in enumerate(trained):
        mask[b, :len(e.tokens)] = torch.tensor(e.loss_mask, dtype=torch.float)
        mu[b, :len(e.tokens)] = torch.tensor(e.logprobs) * mask[b, :len(e.tokens)]
    kept = behaviour_trust_mask(logp, mu, adv, mask, ClipTrustRegion(type="clip"))
    iw = importance_weights(logp, mu, mask, MaskCorrection(type="mask", low=0.7, high=1.4))
    return {"advantages": adv, "learner_logprobs": logp, "trust_kept": kept, "cause": token_causes(kept, iw, adv, mask)}


def make_run(out: Path, steps: int = 6, groups: int = 4, samples: int = 4, seed: int = 0,
             evals: bool = True, dropped: bool = False, config: dict | None = None) -> Path:
    """A finished run of `steps` steps with `groups` groups of `samples` episodes per step, every group
    written, its second group's rewards all equal (GRPO: advantage 0); evals before and after RL on 5
    held-out tasks (summary.json: scores 0.1 and 0.4) and every third step (eval_score); a metric that is
    constant (tools/calls_per_turn 0). `dropped`: one more group a step that the run dropped (written
    flagged): at even steps one the dynamic filter dropped (rewards all 0), at odd steps one too stale
    (sampled 3 versions earlier).
    `config`: summary.json's and run_config.json's config (default: train.steps only)."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    config = config if config is not None else {"train": {"steps": steps}}
    sink = MetricsSink(out, steps, show=False, run_config=config)
    writer = RolloutWriter(out / "rollouts.jsonl", decode=decode)
    ev = RolloutWriter(out / "eval_episodes.jsonl", decode=decode) if evals else None
    if ev is not None:
        ev.write_eval(0, "before", [episode(rng, 0, -1 - i, 0, 1) for i in range(5)])
    for step in range(steps):
        batch = [Group(group_id=step * groups + g, task={"id": f"task-{step * groups + g}"},
                       episodes=[episode(rng, step, step * groups + g, s, rng.randint(1, 4)) for s in range(samples)])
                 for g in range(groups)]
        if groups > 1:
            for e in batch[1].episodes:
                e.reward = batch[1].episodes[0].reward
        eps = [e for g in batch for e in g.episodes]
        sink.log({"step": step, "version": step + 1, "reward_mean": sum(e.reward for e in eps) / len(eps),
                  "success_rate": sum(e.success for e in eps) / len(eps), "staleness_max": min(step, 2),
                  "policy/trust_masked_frac": rng.random() * 0.1, "push_pause_s": 0.01 * (step + 1),
                  "rollout_tokens_per_s": 100.0 + step, "tools/calls_per_turn": 0.0,
                  **({"eval_score": 0.1 + 0.3 * (step + 1) / steps} if (step + 1) % 3 == 0 else {})})
        trained = [e for e in eps if e.trainable]
        writer.write(step, batch, trained, learner_tensors(rng, trained))
        if dropped:
            ids, stale = 10_000 + step, step % 2 == 1
            group = Group(group_id=ids, task={"id": f"task-{ids}"},
                          episodes=[episode(rng, max(0, step - 3) if stale else step, ids, s, 1) for s in range(samples)])
            for e in group.episodes:
                e.status = "ok"
                e.reward = e.reward if stale else 0.0
            writer.write_dropped(step, [group], "stale" if stale else "filtered")
    if ev is not None:
        ev.write_eval(steps, "after", [episode(rng, steps, -1 - i, 0, 2) for i in range(5)])
        ev.close()
    writer.close()
    sink.write_summary({"config": config, "eval_before": {"score": 0.1, "n": 5, "failed": {}},
                        "eval_after": {"score": 0.4, "n": 5, "failed": {}}, "train": {"max_staleness_seen": 2}})
    return out


def add_long_group(run: Path, step: int, turns: int, seed: int = 0) -> int:
    """Appends one trained group of two long episodes (`turns` turns each, with their learner values) to a
    finished run's rollouts.jsonl, at `step` (past its last: the writer keeps the rows before it); the
    number of tokens of the first."""
    rng = random.Random(seed)
    group = Group(group_id=90_000, task={"id": "task-long"},
                  episodes=[episode(rng, step, 90_000, s, turns) for s in range(2)])
    for e in group.episodes:
        e.status = "ok"
    writer = RolloutWriter(run / "rollouts.jsonl", start_step=step, decode=decode)
    writer.write(step, [group], group.episodes, learner_tensors(rng, group.episodes))
    writer.close()
    return len(group.episodes[0].tokens)
