"""learner.max_step_kl: a bound on how far one optimizer step may move the actor, the first of a batch
included (learner.target_kl only stops the steps after it).

After each actor step, a no-grad pass over the step's own rows measures KL(pi_before || pi_after) (k3, a
mean: `agentrl.algo.step_kl`; pi_before is the training pass's log pi, taken at the weights before the step).
Past the bound the step is shortened, theta = theta_0 + s (theta_1 - theta_0), and measured again: a
backtracking line search as TRPO's, on top of Adam. Each try takes s from the last one's KL, aiming at half
the bound as if KL grew with the square of the step's length (true near theta_0; farther out it can grow
slower, so a try lands above the bound and the next goes on from it, or faster, so it lands well below).
After `TRIES` tries still above the bound the step is dropped (s = 0): a step never leaves the policy farther
than the bound on its tokens. Steps within it pay one no-grad pass.
The moments Adam took from the step's gradient stay: undoing them too would only repeat the step next batch.

Why: on the 16-turn workload a batch's first step at times moved the policy by a KL of 0.3-1.0 against a
median of 0.0007, and two steps a batch collapsed from there (docs/benchmarks.md, "Two optimizer steps a
batch with an early stop on KL"). The module's own weights are the optimizer's (ZeRO-0, float32: the
config's validator), so shortening them shortens the step.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from agentrl.algo import step_kl
from agentrl.learner.models import trainable_params
from agentrl.types import TrainBatch


TRIES = 4  # measures after the first; in the tests a KL 60x the bound is within it after two


def step_scale(kl: float, bound: float, scale: float = 1.0) -> float:
    """The next try's length, a share of the whole step's: `scale` if its KL is within the bound, else
    scale * sqrt(bound / (2 kl)): aimed at half the bound as if KL were quadratic in the step's length (true
    near its start), so that a try lands within the bound, not at its edge."""
    return scale if kl <= bound else scale * math.sqrt(bound / (2.0 * kl))


def trainable_copy(module: torch.nn.Module) -> list[torch.Tensor]:
    """The trainable weights before a step, copied (the tiny cost of a bound: one copy of the weights)."""
    return [p.detach().clone() for p in trainable_params(module)]


@torch.no_grad()
def bound_step(module: torch.nn.Module, before: list[torch.Tensor],
               logprobs: Callable[[TrainBatch, range], torch.Tensor], batch: TrainBatch, rows: range,
               logp_before: torch.Tensor, bound: float) -> dict[str, float]:
    """Measure the step just taken on `rows` (`logp_before`: (B, T) log pi there before it) and shorten it past
    `bound`. Every rank measures the same gathered rows, so every rank scales alike. Returns the metrics
    `moved_kl` (the whole step's), `step_kl_bounded` (the step's as left) and `step_scale` (its share kept)."""
    sl, params = slice(rows.start, rows.stop), trainable_params(module)

    def measure() -> float:
        return step_kl(logp_before[sl], logprobs(batch, rows)[sl], batch.loss_mask[sl])

    moved = kl = measure()
    scale, whole = 1.0, None
    for _ in range(TRIES):
        if kl <= bound:
            break
        whole = whole or trainable_copy(module)
        scale = step_scale(kl, bound, scale)
        for p, p0, p1 in zip(params, before, whole):
            p.copy_(torch.lerp(p0, p1, scale))
        kl = measure()
    if kl > bound:  # still past it after the last try: the step is dropped
        for p, p0 in zip(params, before):
            p.copy_(p0)
        scale, kl = 0.0, 0.0
    return {"moved_kl": moved, "step_kl_bounded": kl, "step_scale": scale}
