"""Preference losses on the policy (DPO, IPO, KTO; one registry, one signature) and the reward-model
losses (Bradley-Terry pairs, process-reward steps).

The policy losses take sequence log-probs (the sum over response tokens) of the policy and of the frozen
reference, and compare the policy's implicit reward r(x, y) = beta * (log pi(y|x) - log ref(y|x)) of
chosen (preferred, desirable) and rejected (dispreferred, undesirable) responses:
    PREFERENCE_LOSSES[name](policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=..., ...)
        -> PreferenceLoss(losses, chosen_rewards, rejected_rewards)
Every loss accepts (and ignores) the keyword settings of the others, so a caller can pass one settings
dict whichever loss is configured. The reference log-probs should come from a frozen model (or be
detached by the caller): the losses differentiate whatever they are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class PreferenceLoss:
    losses: torch.Tensor  # per-example losses: (B,) for paired losses; (Bc + Br,) for KTO, chosen rows first
    chosen_rewards: torch.Tensor  # beta * (logp - ref_logp) of the chosen / desirable rows, detached
    rejected_rewards: torch.Tensor  # the same for the rejected / undesirable rows, detached


def _rewards(policy: torch.Tensor, ref: torch.Tensor, beta: float) -> torch.Tensor:
    """The implicit reward beta * log(pi / ref) (Rafailov et al. 2023, eq. 5), detached: a metric."""
    return (beta * (policy - ref)).detach()


def dpo(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
        ref_rejected: torch.Tensor, *, beta: float, label_smoothing: float = 0.0, **_) -> PreferenceLoss:
    """DPO (Rafailov et al. 2023, eq. 7): the Bradley-Terry likelihood of the preferences under the implicit
    rewards, h = beta * ((pc - rc) - (pr - rr)), loss = -log sigmoid(h).

    `label_smoothing` eps is conservative DPO (cDPO, Mitchell 2023; OpenRLHF and TRL's "sigmoid" loss):
    each label is taken to be flipped with probability eps, loss = -(1 - eps) log sigmoid(h) - eps log
    sigmoid(-h), which stops the margin growing without bound on noisy labels (the loss is minimal at
    a finite h = log((1 - eps) / eps))."""
    h = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    losses = -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    return PreferenceLoss(losses, _rewards(policy_chosen, ref_chosen, beta),
                          _rewards(policy_rejected, ref_rejected, beta))


def ipo(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
        ref_rejected: torch.Tensor, *, beta: float, **_) -> PreferenceLoss:
    """IPO (Azar et al. 2023, eq. 17): regress the log-ratio margin onto a fixed target instead of pushing
    it to infinity, which DPO does on deterministic preferences:
        loss = (((pc - rc) - (pr - rr)) - 1 / (2 beta))^2
    This is the paper's empirical loss with its regulariser tau named `beta`, as in TRL and OpenRLHF: unlike
    DPO's h, the margin is not multiplied by beta; beta sets the target margin 1 / (2 beta) (a smaller
    beta lets the policy move further from the reference). The implicit rewards are still reported as
    beta * (logp - ref_logp), like DPO's. TRL feeds IPO per-token averaged log-probs; pass those here
    for that behaviour, sums otherwise."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    losses = (margin - 1 / (2 * beta)) ** 2
    return PreferenceLoss(losses, _rewards(policy_chosen, ref_chosen, beta),
                          _rewards(policy_rejected, ref_rejected, beta))


def kto(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
        ref_rejected: torch.Tensor, *, beta: float, desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
        kl: torch.Tensor | float | None = None, **_) -> PreferenceLoss:
    """KTO (Ethayarajh et al. 2024, eq. 8): unpaired feedback; each response is judged against a reference
    point z, an estimate of KL(pi || ref), through a prospect-theory value function:
        desirable:   desirable_weight   * (1 - sigmoid(beta * ((pc - rc) - z)))
        undesirable: undesirable_weight * (1 - sigmoid(beta * (z - (pr - rr))))
    Chosen (desirable) and rejected (undesirable) rows are independent: their counts may differ and either
    may be zero. z is `kl` when given (e.g. TRL's estimate on mismatched prompt-response pairs), else the
    batch estimate max(0, mean over all rows of (logp - ref_logp)). z is detached: it is a baseline, not
    a quantity to optimise (the paper and TRL do the same). The weights let one rebalance unequal counts
    (the paper recommends desirable_weight * n_desirable / (undesirable_weight * n_undesirable) in
    [1, 4/3]). Losses: the chosen rows' first, then the rejected rows'."""
    log_ratio_c = policy_chosen - ref_chosen
    log_ratio_r = policy_rejected - ref_rejected
    if kl is None:
        all_rows = torch.cat([log_ratio_c.reshape(-1), log_ratio_r.reshape(-1)]).detach()
        z = all_rows.mean().clamp(min=0) if all_rows.numel() else all_rows.new_zeros(())
    else:
        z = torch.as_tensor(kl, dtype=log_ratio_c.dtype, device=log_ratio_c.device).detach()
    desirable = desirable_weight * (1 - torch.sigmoid(beta * (log_ratio_c - z)))
    undesirable = undesirable_weight * (1 - torch.sigmoid(beta * (z - log_ratio_r)))
    return PreferenceLoss(torch.cat([desirable, undesirable]), _rewards(policy_chosen, ref_chosen, beta),
                          _rewards(policy_rejected, ref_rejected, beta))


PreferenceLossFn = Callable[..., PreferenceLoss]
PREFERENCE_LOSSES: dict[str, PreferenceLossFn] = {"dpo": dpo, "ipo": ipo, "kto": kto}


def bradley_terry(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Per-pair -log sigmoid(r_chosen - r_rejected): the negative log-likelihood of the preferences under
    the Bradley-Terry model P(chosen > rejected) = sigmoid(r_c - r_r) (Ouyang et al. 2022, eq. 1), the loss
    of a scalar reward model. Reduce (mean) at the call site."""
    return -F.logsigmoid(r_chosen - r_rejected)


def prm_token_loss(reward_logits_NR: torch.Tensor, labels_N: torch.Tensor) -> torch.Tensor:
    """Per-step cross-entropy of a process reward model trained as a language model (Math-Shepherd; OpenRLHF's
    PRM trainer): at each of the N step-end placeholder positions, the LM logits restricted to the R reward
    tokens (e.g. "+" and "-") are a classifier over the step's label; `labels_N` index those R tokens
    (0 = the good label). Restricting to R tokens keeps the rest of the vocabulary out of the softmax,
    so the score below is a proper two- (or R-) way probability. Returns (N,)."""
    return F.cross_entropy(_at_least_f32(reward_logits_NR), labels_N.long(), reduction="none")


def prm_step_scores(reward_logits_NR: torch.Tensor) -> torch.Tensor:
    """P(good step) = softmax over the R reward tokens' logits, at index 0 (the good label). Returns (N,)."""
    return torch.softmax(_at_least_f32(reward_logits_NR), dim=-1)[:, 0]


def _at_least_f32(x: torch.Tensor) -> torch.Tensor:
    """bf16 / fp16 logits upcast for the softmax; float64 kept (the tests' references are float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
