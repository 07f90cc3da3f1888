"""A small run folder for the viewer's tests and bench: episodes built by hand, written by the run's own
writers (agentrl.rollout.records.RolloutWriter: rollouts.jsonl, eval_episodes.jsonl; MetricsSink:
metrics.jsonl, summary.json), so the files are byte for byte what a run writes."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from agentrl.algo import behaviour_trust_mask
from agentrl.config.algo import ClipTrustRegion
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


def learner_tensors(rng: random.Random, trained: list[Episode]) -> dict[str, torch.Tensor]:
    """(B, T) per-token values as the learner returns them (`StepMetrics.token_values`): an advantage per
    row, log pi = mu + a drift in (-0.5, 0.5) on scored tokens, and the shipped trust region's decision on
    them (clip at mu, eps 0.2: a drift below log 0.8 with A < 0 or above log 1.2 with A > 0 is masked out)."""
    T = max(len(e.tokens) for e in trained)
    adv, logp = torch.zeros(len(trained), T), torch.zeros(len(trained), T)
    for b, e in enumerate(trained):
        mask = torch.tensor(e.loss_mask, dtype=torch.float)
        adv[b, :len(e.tokens)] = round(rng.uniform(-2, 2), 3) * mask
        drift = torch.tensor([rng.uniform(-0.5, 0.5) for _ in e.tokens])
        logp[b, :len(e.tokens)] = (torch.tensor(e.logprobs) + drift) * mask
    mu, mask = torch.zeros_like(logp), torch.zeros_like(logp)
    for b, e in enumerate(trained):
        mask[b, :len(e.tokens)] = torch.tensor(e.loss_mask, dtype=torch.float)
        mu[b, :len(e.tokens)] = torch.tensor(e.logprobs) * mask[b, :len(e.tokens)]
    kept = behaviour_trust_mask(logp, mu, adv, mask, ClipTrustRegion(type="clip"))
    return {"advantages": adv, "learner_logprobs": logp, "trust_kept": kept}


def make_run(out: Path, steps: int = 6, groups: int = 4, samples: int = 4, seed: int = 0,
             evals: bool = True) -> Path:
    """A finished run of `steps` steps with `groups` groups of `samples` episodes per step, every group
    written; evals before and after RL on 5 held-out tasks."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    sink = MetricsSink(out, steps, show=False)
    writer = RolloutWriter(out / "rollouts.jsonl", decode=decode)
    ev = RolloutWriter(out / "eval_episodes.jsonl", decode=decode) if evals else None
    if ev is not None:
        ev.write_eval(0, "before", [episode(rng, 0, -1 - i, 0, 1) for i in range(5)])
    for step in range(steps):
        batch = [Group(group_id=step * groups + g, task={"id": f"task-{step * groups + g}"},
                       episodes=[episode(rng, step, step * groups + g, s, rng.randint(1, 4)) for s in range(samples)])
                 for g in range(groups)]
        eps = [e for g in batch for e in g.episodes]
        sink.log({"step": step, "version": step + 1, "reward_mean": sum(e.reward for e in eps) / len(eps),
                  "success_rate": sum(e.success for e in eps) / len(eps), "staleness_max": min(step, 2),
                  "policy/trust_masked_frac": rng.random() * 0.1, "push_pause_s": 0.01 * (step + 1),
                  "rollout_tokens_per_s": 100.0 + step})
        trained = [e for e in eps if e.trainable]
        writer.write(step, batch, trained, learner_tensors(rng, trained))
    if ev is not None:
        ev.write_eval(steps, "after", [episode(rng, steps, -1 - i, 0, 2) for i in range(5)])
        ev.close()
    writer.close()
    sink.write_summary({"config": {"train": {"steps": steps}}, "eval_before": {"score": 0.1, "n": 5, "failed": {}},
                        "eval_after": {"score": 0.4, "n": 5, "failed": {}}, "train": {"max_staleness_seen": 2}})
    return out
