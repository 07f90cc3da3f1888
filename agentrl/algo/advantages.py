"""Advantage estimators: one registry, one signature `(AdvantageInputs) -> AdvantageOutput`.

Shapes: B episodes (rows), T ledger positions. Every estimator returns per-token advantages `(B, T)`
that are 0 wherever `mask_BT` is 0, so env/prompt/padding tokens never carry a learning signal.
Scalar estimators compute one number per episode and broadcast it to the episode's masked tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class AdvantageInputs:
    """Everything any estimator may read; each estimator documents the fields it uses."""

    rewards_B: torch.Tensor  # (B,) float, scalar episode reward
    group_ids_B: torch.Tensor  # (B,) long, episodes of one task share an id (arbitrary, not contiguous)
    mask_BT: torch.Tensor  # (B, T) float, 1 on policy-generated tokens
    values_BT: torch.Tensor | None = None  # (B, T) critic values V(s_t) (gae only)
    # (B, T) per-token rewards (gae only); None puts the scalar reward on each row's last masked token
    token_rewards_BT: torch.Tensor | None = None
    input_ids_BT: torch.Tensor | None = None  # (B, T) long, the rows' tokens (state_grpo: which states are equal)
    gamma: float = 1.0  # discount (gae only)
    lam: float = 1.0  # GAE lambda (gae only)
    whiten: bool = False  # gae only: advantages to mean 0, std 1 over the batch's generated tokens
    eps: float = 1e-6  # added to standard deviations before dividing


@dataclass
class AdvantageOutput:
    advantages_BT: torch.Tensor  # (B, T), 0 where mask is 0
    returns_BT: torch.Tensor | None = None  # (B, T) critic targets A + V (gae only), 0 where mask is 0


AdvantageFn = Callable[[AdvantageInputs], AdvantageOutput]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator to `ADVANTAGES` under `name` (names are unique)."""

    def deco(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return deco


def _broadcast(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> AdvantageOutput:
    """Scalar per-episode advantage -> every masked token of that episode."""
    return AdvantageOutput(advantages_BT=adv_B.to(mask_BT.dtype)[:, None] * mask_BT)


def _group_stats(x_B: torch.Tensor, group_ids_B: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-episode statistics of the episode's group: (mean_B, std_B, sum_B, count_B), float64.

    std is unbiased (divides by n - 1, like torch.std, as in OpenRLHF and verl); a group of one has
    std 0 instead of torch.std's NaN. Float64 keeps `x - mean` exactly 0 for a group of equal
    rewards, so dividing by (0 + eps) cannot turn rounding noise into a visible advantage.
    """
    _, inv_B = torch.unique(group_ids_B, return_inverse=True)
    n_groups = int(inv_B.max()) + 1 if inv_B.numel() else 0
    x_B = x_B.double()
    zeros_G = torch.zeros(n_groups, dtype=torch.float64, device=x_B.device)
    count_G = zeros_G.index_add(0, inv_B, torch.ones_like(x_B))
    sum_G = zeros_G.index_add(0, inv_B, x_B)
    mean_B = (sum_G / count_G)[inv_B]
    sq_G = zeros_G.index_add(0, inv_B, (x_B - mean_B) ** 2)
    std_B = (sq_G / (count_G - 1).clamp_min(1)).sqrt()[inv_B]
    return mean_B, std_B, sum_G[inv_B], count_G[inv_B]


def _whiten(x_B: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean(x)) / (std(x) + eps) over the whole batch, unbiased std; a batch of one gives 0."""
    x_B = x_B.double()
    std = x_B.std() if x_B.numel() > 1 else x_B.new_zeros(())
    return (x_B - x_B.mean()) / (std + eps)


@register_advantage("grpo")
def grpo(inp: AdvantageInputs) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

    A group of size 1 has no baseline to compare against, so its advantage is 0 (r - mean is 0 and
    its std is taken as 0), rather than the NaN that torch.std would give.
    """
    mean_B, std_B, _, _ = _group_stats(inp.rewards_B, inp.group_ids_B)
    return _broadcast((inp.rewards_B.double() - mean_B) / (std_B + inp.eps), inp.mask_BT)


@register_advantage("dr_grpo")
def dr_grpo(inp: AdvantageInputs) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_g(r)."""
    mean_B, _, _, _ = _group_stats(inp.rewards_B, inp.group_ids_B)
    return _broadcast(inp.rewards_B.double() - mean_B, inp.mask_BT)


@register_advantage("rloo")
def rloo(inp: AdvantageInputs) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024): A_i = r_i - sum_{j in g, j != i} r_j / (n_g - 1); n_g = 1 -> 0."""
    _, _, sum_B, count_B = _group_stats(inp.rewards_B, inp.group_ids_B)
    r_B = inp.rewards_B.double()
    baseline_B = (sum_B - r_B) / (count_B - 1).clamp_min(1)
    return _broadcast(torch.where(count_B > 1, r_B - baseline_B, 0.0), inp.mask_BT)


@register_advantage("reinforce_pp")
def reinforce_pp(inp: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++ (Hu 2025; OpenRLHF): A_i = (r_i - mean_B(r)) / (std_B(r) + eps) over the batch.

    Whitening is over episodes (each episode counts once); OpenRLHF whitens over masked tokens,
    which weights long episodes more when lengths differ.
    """
    return _broadcast(_whiten(inp.rewards_B, inp.eps), inp.mask_BT)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(inp: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++-baseline (OpenRLHF `reinforce_baseline`): A_i = whiten_B(r_i - mean_g(r))."""
    mean_B, _, _, _ = _group_stats(inp.rewards_B, inp.group_ids_B)
    return _broadcast(_whiten(inp.rewards_B.double() - mean_B, inp.eps), inp.mask_BT)


def _last_token_rewards(rewards_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) zeros with each row's scalar reward on its last masked token (rows without one: none)."""
    pos_T = torch.arange(mask_BT.shape[1], device=mask_BT.device)
    has_B = mask_BT.sum(-1) > 0
    last_B = torch.where(mask_BT > 0, pos_T, 0).amax(-1)
    out_BT = torch.zeros_like(mask_BT)
    rows_B = torch.arange(mask_BT.shape[0], device=mask_BT.device)
    out_BT[rows_B[has_B], last_B[has_B]] = rewards_B[has_B].to(mask_BT.dtype)
    return out_BT


@register_advantage("gae")
def gae(inp: AdvantageInputs) -> AdvantageOutput:
    """GAE (Schulman et al. 2016) over the generated tokens of each row only.

    The time axis of a row is its sequence of mask == 1 positions, so env/tool tokens between the
    turns of a multi-turn episode are skipped (not steps), and rewards placed on them are ignored.
        delta_t = r_t + gamma * V_{t+1} - V_t,   V after the last generated token = 0
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                      (critic targets)
    With `whiten`, A_t -> (A_t - mean(A)) / (std(A) + eps) over every generated token of the batch (unbiased
    std), after R_t is taken: verl's `masked_whiten` and OpenRLHF's advantage normalisation. Under Adam the
    scale hardly matters (a step's size is the learning rate's: Adam divides by the gradients' running scale);
    what whitening adds is a batch-wide shift, another baseline (docs/benchmarks.md, "Staleness": no gain
    measured on the 16-turn task).
    """
    if inp.values_BT is None:
        raise ValueError("gae needs values_BT (critic values)")
    mask_BT = inp.mask_BT
    values_BT = inp.values_BT.detach().to(mask_BT.dtype)
    r_BT = inp.token_rewards_BT
    r_BT = _last_token_rewards(inp.rewards_B, mask_BT) if r_BT is None else r_BT.to(mask_BT.dtype)
    next_value_B = torch.zeros_like(mask_BT[:, 0])  # V at the next generated position
    next_adv_B = torch.zeros_like(mask_BT[:, 0])
    adv_BT = torch.zeros_like(mask_BT)
    for t in reversed(range(mask_BT.shape[1])):
        m_B = mask_BT[:, t] > 0
        delta_B = r_BT[:, t] + inp.gamma * next_value_B - values_BT[:, t]
        a_B = delta_B + inp.gamma * inp.lam * next_adv_B
        adv_BT[:, t] = torch.where(m_B, a_B, 0.0)
        next_value_B = torch.where(m_B, values_BT[:, t], next_value_B)
        next_adv_B = torch.where(m_B, a_B, next_adv_B)
    # where, not a product with the mask: a padded value may be NaN or inf, and NaN * 0 is NaN.
    returns_BT = torch.where(mask_BT > 0, adv_BT + values_BT, 0.0)
    if inp.whiten:
        adv_BT = _masked_whiten(adv_BT, mask_BT, inp.eps)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=returns_BT)


def _masked_whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float) -> torch.Tensor:
    """`_whiten` over the positions where mask is 1, exactly 0 elsewhere."""
    m_BT = mask_BT > 0
    out_BT = torch.zeros_like(x_BT)
    out_BT[m_BT] = _whiten(x_BT[m_BT], eps).to(x_BT.dtype)
    return out_BT
