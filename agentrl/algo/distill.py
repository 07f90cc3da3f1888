"""On-policy distillation: the student samples, a teacher scores every sampled token, and the per-token
reverse KL is the advantage (Agarwal et al. 2024, GKD; Thinking Machines' "On-Policy Distillation").

Shapes: B rows, T ledger positions; `mask_BT` is float, 1 on tokens the policy generated (tool and env
tokens have mask 0 and get no advantage, as they get no loss). Every function returns detached tensors.

    A_t^distill = -coef * (log mu(y_t) - log pi_T(y_t)) * mask_t                          (1)

y_t is the token the student sampled, mu the distribution it was sampled from (the behaviour
log-probs vLLM returned, `TrainBatch.behav_logprobs`), pi_T the teacher at temperature 1 over its full
vocabulary. Summed over a row, E_mu[sum_t (log mu - log pi_T)] = KL(mu || pi_T), the sequence-level
reverse KL, so a policy-gradient step on (1), importance-weighted from mu as every loss here is,
lowers the reverse KL to the teacher (mode-seeking: the student is pushed off what the teacher finds
unlikely). Each token's own term is its advantage, undiscounted: no reward-to-go sum (Thinking
Machines' recipe; later tokens' terms enter through the later tokens' own gradients).

Why mu and not pi_prox or pi_theta: the tokens were drawn from mu, so log mu - log pi_T is an unbiased
one-sample estimate of KL(mu || pi_T) at that position, exactly as the in-reward KL penalty reads mu
(`algo.kl.type: reward`); the loss's importance weight pi_prox / mu then carries the estimate over
to the policy being trained. mu is known when the episode ends, so the advantage needs no learner pass.

Why the teacher at temperature 1 and full vocabulary: the teacher is the target distribution, not a
sampler; a truncated or sharpened teacher would give tokens outside its nucleus log 0 and drive the
student to collapse onto the teacher's mode. vLLM's prompt log-probs (`Engine.prompt_logprobs`) are
exactly that distribution (a log-softmax of the raw logits); the learner placement scores with
temperature 1 and top_p 1 for the same numbers.

The env's reward-based advantage (any `algo.advantage` estimator) can be kept beside it:
    A_t = A_t^distill + env_weight * A_t^env                                              (2)
or left out (A_t = A_t^distill; rewards are still computed and logged).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def distill_advantages(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                       coef: float) -> torch.Tensor:
    """(B, T) equation (1): -coef * (log mu - log pi_T) on scored tokens, 0 elsewhere. Padding and
    unscored positions may hold anything (inf/NaN): they are selected away, not multiplied by 0."""
    diff_BT = torch.where(mask_BT > 0, student_logp_BT.detach().float() - teacher_logp_BT.detach().float(), 0.0)
    return -coef * diff_BT * mask_BT


@torch.no_grad()
def combine_advantages(distill_BT: torch.Tensor, env_BT: torch.Tensor, env_weight: float | None) -> torch.Tensor:
    """(B, T) equation (2): distill + env_weight * env; `env_weight` None: the distillation term alone."""
    if env_weight is None:
        return distill_BT.clone()
    return distill_BT + env_weight * env_BT.to(distill_BT.dtype)


@torch.no_grad()
def distill_metrics(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor,
                    mask_BT: torch.Tensor) -> dict[str, float]:
    """The reverse KL estimate k1 = log mu - log pi_T: its mean over scored tokens (`distill/kl_token`) and
    the mean over rows of its sum over each row's scored tokens (`distill/kl_seq`, KL(mu || pi_T) per
    sequence); the teacher's mean log-prob of the sampled tokens (`distill/teacher_logp`)."""
    scored = mask_BT > 0
    kl_BT = torch.where(scored, student_logp_BT.float() - teacher_logp_BT.float(), 0.0)
    teacher_BT = torch.where(scored, teacher_logp_BT.float(), 0.0)
    n = scored.sum().clamp_min(1)
    return {"distill/kl_token": float(kl_BT.sum() / n), "distill/kl_seq": float(kl_BT.sum(-1).mean()),
            "distill/teacher_logp": float(teacher_BT.sum() / n)}
