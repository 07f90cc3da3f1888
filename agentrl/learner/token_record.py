"""A step's per-token values for the run viewer (`StepMetrics.token_values`, written beside each trained
episode in rollouts.jsonl by agentrl.rollout.records): recorded as the step makes its decisions, only when
the run writes them down (`TrainBatch.record_values`).

  advantages        what the loss weighed each token by
  learner_logprobs  log pi at the pass that trained the token (pi - mu: how far the learner has moved)
  trust_kept        1 where the trust region kept the token, 0 where it masked it out (`PolicyLossOut.keep_BT`)
  cause             why the token was or was not trained: a code of agentrl.algo.correction.TOKEN_CAUSES, the
                    loss's own (`PolicyLossOut.cause_BT`; a loss that gives none: 3 where masked, else 0), or
                    the step's where it trained no row: 6 target_kl ended the step first, 7 the actor is frozen
"""

from __future__ import annotations

import torch

from agentrl.algo import PolicyLossOut
from agentrl.types import TrainBatch

TARGET_KL_STOPPED, ACTOR_FROZEN = 6, 7  # agentrl.algo.correction.TOKEN_CAUSES


class TokenRecord:
    """(B, T) buffers over one batch's rows, filled mini-batch by mini-batch."""

    def __init__(self, batch: TrainBatch) -> None:
        self.learner_logp = torch.zeros_like(batch.behav_logprobs)
        self.kept = torch.ones_like(batch.behav_logprobs)
        self.causes = torch.zeros(batch.behav_logprobs.shape, dtype=torch.int8)

    def decided(self, rows: slice, out: PolicyLossOut, mask_BT: torch.Tensor) -> None:
        """The policy loss's decisions over `rows` (its inputs' rows, mask `mask_BT`)."""
        self.kept[rows] = out.keep_BT
        cause_BT = out.cause_BT if out.cause_BT is not None else ((out.keep_BT == 0) & (mask_BT > 0)) * 3
        self.causes[rows] = cause_BT.to(self.causes.dtype).cpu()

    def stopped(self, start: int) -> None:
        """target_kl ended the step before row `start`: no row from it on is trained."""
        self.causes[start:] = TARGET_KL_STOPPED

    def values(self, batch: TrainBatch, actor_trained: bool) -> dict[str, torch.Tensor]:
        """`token_values`: a frozen actor's step has advantages and causes only."""
        causes = self.causes if actor_trained else torch.full_like(self.causes, ACTOR_FROZEN)
        out = {"advantages": batch.advantages, "cause": causes * (batch.loss_mask > 0)}
        return {**out, "learner_logprobs": self.learner_logp, "trust_kept": self.kept} if actor_trained else out
