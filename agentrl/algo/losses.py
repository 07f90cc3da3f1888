"""Policy losses (one registry, one signature), loss aggregation, KL estimators and the critic loss.

Every policy loss is decoupled PPO (Hilton et al. 2022; AReaL): the clipped ratio is taken against
pi_old (the proximal policy, or mu in bypass mode) and the per-token loss is multiplied by the
detached importance weight w = pi_old / mu and the behaviour trust region's keep-mask m (both from
`correction.py`):
    loss_t = -m_t * w_t * surrogate_t(r_t, A_t),   r_t = pi_theta(y_t) / pi_old(y_t)
Shapes: B sequences, T ledger positions; every (B, T) tensor is aligned by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import torch

from .correction import (CorrectionSettings, TrustRegionSettings, behaviour_trust_mask, correction_metrics,
                         ess_step_scale, importance_weights, masked_mean, token_causes)

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant")
KL_KINDS = ("k1", "k2", "k3")


@dataclass
class PolicyLossInputs:
    logp_BT: torch.Tensor  # (B, T) log pi_theta(token), requires grad
    old_logp_BT: torch.Tensor  # (B, T) PPO ratio denominator: pi_prox (decoupled) or mu (bypass)
    behav_logp_BT: torch.Tensor  # (B, T) mu: behaviour logprobs recorded by vLLM
    advantages_BT: torch.Tensor  # (B, T)
    mask_BT: torch.Tensor  # (B, T) float, 1 on policy-generated tokens
    entropy_BT: torch.Tensor | None = None  # (B, T) policy entropy per position (metric / bonus)
    age_BT: torch.Tensor | None = None  # (B, T) learner version minus the token's version (clip with half_life reads it)


class PolicyLossSettings(Protocol):
    """What a policy loss reads: the config tree's `algo` section (`agentrl.config.AlgoConfig`) itself, its
    sub-configs typed by their `type`, never flattened. Stated here rather than imported, since algo/ imports
    only torch; the bounds, defaults and descriptions live in the config tree."""

    clip_low: float  # r = pi_theta / pi_old is clipped below at 1 - clip_low
    clip_high: float  # ... and above at 1 + clip_high (DAPO's clip-higher when > clip_low)
    dual_clip: float | None  # c > 1: loss <= -c * A for A < 0 (Ye et al. 2020, dual-clip PPO)
    correction: CorrectionSettings  # the importance weight pi_old / mu (`importance_weights`)
    trust_region: TrustRegionSettings  # the keep-mask around mu (`behaviour_trust_mask`)
    agg: str  # see `aggregate`
    constant_norm: float  # "constant" aggregation divides the token sum by B * constant_norm
    entropy_coef: float  # loss -= entropy_coef * aggregate(entropy)


class PolicyLossOut(NamedTuple):
    """What a policy loss returns."""

    loss: torch.Tensor  # the scalar to backward
    metrics: dict[str, float]  # over the inputs' masked tokens
    # (B, T) detached 0/1: the trust region's decision per token (`behaviour_trust_mask`), the one
    # `trust_masked_frac` counts; the learner records it for the run viewer rather than deciding again
    keep_BT: torch.Tensor
    # (B, T) int8: why each scored token was or was not trained (correction.TOKEN_CAUSES, `token_causes`);
    # None from a loss that does not say (the learner then records the keep-mask's decision only)
    cause_BT: torch.Tensor | None = None


PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossSettings], PolicyLossOut]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a policy loss to `POLICY_LOSSES` under `name` (names are unique)."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, agg: str, constant_norm: float = 1.0) -> torch.Tensor:
    """Reduce a per-token loss to a scalar (verl's `agg_loss` modes).

    token_mean:          sum_{b,t} m l / sum_{b,t} m                   (DAPO token-level)
    seq_mean_token_mean: mean_b [sum_t m l / sum_t m]                  (original GRPO)
    seq_mean_token_sum:  mean_b [sum_t m l]
    constant:            sum_{b,t} m l / (B * constant_norm)           (Dr. GRPO, norm = max length)
    The seq_mean modes average over rows with at least one masked token; empty rows do not dilute.
    """
    loss_BT = torch.where(mask_BT > 0, loss_BT, 0.0) * mask_BT
    if agg == "token_mean":
        return loss_BT.sum() / mask_BT.sum().clamp_min(1e-8)
    if agg == "constant":
        return loss_BT.sum() / (mask_BT.shape[0] * constant_norm)
    if agg not in ("seq_mean_token_mean", "seq_mean_token_sum"):
        raise ValueError(f"unknown aggregation {agg!r}; expected one of {AGGREGATIONS}")
    n_B = mask_BT.sum(-1)
    seq_B = loss_BT.sum(-1)
    if agg == "seq_mean_token_mean":
        seq_B = seq_B / n_B.clamp_min(1e-8)
    rows_B = (n_B > 0).to(loss_BT.dtype)
    return (seq_B * rows_B).sum() / rows_B.sum().clamp_min(1.0)


_KL: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda lr: lr,  # log p - log q
    "k2": lambda lr: 0.5 * lr**2,  # 0.5 (log p - log q)^2
    "k3": lambda lr: torch.exp(-lr) - 1 + lr,  # q/p - 1 - log(q/p), with log(q/p) = -lr
}


def kl_estimate(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || ref) from tokens sampled from p = pi_theta, q = ref.

    Schulman 2020, "Approximating KL divergence": k1 is unbiased with high variance (can be
    negative), k2 is biased with low variance, k3 is unbiased, low variance and always >= 0.
    Returns (B, T); reduce with `masked_mean` or `aggregate`.
    """
    if kind not in _KL:
        raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")
    return _KL[kind](logp_BT - ref_logp_BT)


def step_kl(old_logp_BT: torch.Tensor, logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """How far optimizer steps moved the policy: the mean per-token KL(pi_old || pi_theta), k3 on tokens
    sampled (nearly) from pi_old, i.e. (r - 1) - log r with r = pi_theta / pi_old (Stable-Baselines3's
    approx_kl, what PPO's target_kl compares). 0 with no scored token."""
    return float(masked_mean(kl_estimate(old_logp_BT, logp_BT, "k3"), mask_BT))


def _log_ratio(inp: PolicyLossInputs) -> torch.Tensor:
    """log r = logp - old_logp, 0 off the mask so padding can never overflow exp()."""
    return torch.where(inp.mask_BT > 0, inp.logp_BT - inp.old_logp_BT.detach(), 0.0)


def _clipped_surrogate(ratio_BT: torch.Tensor, adv_BT: torch.Tensor,
                       cfg: PolicyLossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO (Schulman et al. 2017): l = -min(r A, clip(r, 1-eps_lo, 1+eps_hi) A); dual clip (Ye et
    al. 2020): l = min(l, -c A) for A < 0. Returns the per-token loss and where a clip is active
    (those tokens have zero gradient)."""
    unclipped_BT = -ratio_BT * adv_BT
    clipped_BT = -ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv_BT
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    active_BT = clipped_BT > unclipped_BT
    if cfg.dual_clip is not None:
        dual_BT = (adv_BT < 0) & (loss_BT > -cfg.dual_clip * adv_BT)
        loss_BT = torch.where(dual_BT, -cfg.dual_clip * adv_BT, loss_BT)
        active_BT = active_BT | dual_BT
    return loss_BT, active_BT


def _finish(loss_BT: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, dict[str, float], torch.Tensor],
            active_BT: torch.Tensor, inp: PolicyLossInputs, cfg: PolicyLossSettings) -> PolicyLossOut:
    """Weight by w (`_weights`' weight, keep-mask, metrics and causes), aggregate, add the entropy bonus and
    the shared metrics."""
    weight_BT, keep_BT, metrics, cause_BT = weights
    mask_BT = inp.mask_BT
    loss = aggregate(loss_BT * weight_BT, mask_BT, cfg.agg, cfg.constant_norm)
    metrics["clip_frac"] = float(masked_mean(active_BT.to(mask_BT.dtype), mask_BT))
    if inp.entropy_BT is not None:
        metrics["entropy"] = float(masked_mean(inp.entropy_BT.detach(), mask_BT))
    if cfg.entropy_coef > 0:
        if inp.entropy_BT is None:
            raise ValueError("entropy_coef > 0 needs entropy_BT")
        loss = loss - cfg.entropy_coef * aggregate(inp.entropy_BT, mask_BT, cfg.agg, cfg.constant_norm)
    return PolicyLossOut(loss, metrics, keep_BT, cause_BT)


def _weights(inp: PolicyLossInputs, cfg: PolicyLossSettings,
             level: str | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], torch.Tensor]:
    """The detached weight (B, T) to multiply into the loss: the importance weight (at the correction's
    own level unless `level` says otherwise) times the trust region's keep-mask, times the ESS step scale
    where the correction asks for it (`ess_step`); the keep-mask itself; the correction metrics,
    `trust_masked_frac` the share of tokens dropped; and each token's cause code (`token_causes`)."""
    iw = importance_weights(inp.old_logp_BT, inp.behav_logp_BT, inp.mask_BT, cfg.correction, level)
    keep_BT = behaviour_trust_mask(inp.logp_BT, inp.behav_logp_BT, inp.advantages_BT, inp.mask_BT,
                                   cfg.trust_region, inp.age_BT)
    metrics = correction_metrics(iw, inp.old_logp_BT, inp.behav_logp_BT, inp.mask_BT)
    metrics["trust_masked_frac"] = float(masked_mean(1.0 - keep_BT, inp.mask_BT))
    scale = 1.0
    if getattr(cfg.correction, "ess_step", False):
        scale = metrics["ess_step_scale"] = ess_step_scale(iw)
    return iw.weight_BT * keep_BT * scale, keep_BT, metrics, token_causes(keep_BT, iw, inp.advantages_BT, inp.mask_BT)


@register_policy_loss("ppo_clip")
def ppo_clip(inp: PolicyLossInputs, cfg: PolicyLossSettings) -> PolicyLossOut:
    """Decoupled PPO-clip: loss_t = -w_t min(r_t A_t, clip(r_t, 1-eps_lo, 1+eps_hi) A_t), + dual clip."""
    weights = _weights(inp, cfg)
    loss_BT, active_BT = _clipped_surrogate(_log_ratio(inp).exp(), inp.advantages_BT, cfg)
    return _finish(loss_BT, weights, active_BT, inp, cfg)


@register_policy_loss("gspo")
def gspo(inp: PolicyLossInputs, cfg: PolicyLossSettings) -> PolicyLossOut:
    """GSPO (Zheng et al. 2025), token form as in the paper's GSPO-token and verl:
        s_i   = exp(mean_{t in y_i} (logp_t - old_logp_t))            (sequence ratio)
        s_i,t = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t))           (value s_i, grad s_i * dlogp_t)
        loss_t = -w_i min(s_i,t A_t, clip(s_i,t, 1-eps_lo, 1+eps_hi) A_t)
    With seq_mean_token_mean aggregation and one advantage per sequence this is sequence-level GSPO.
    The importance weight w is always per sequence here (algo.correction.level is not read).
    """
    weights = _weights(inp, cfg, "sequence")
    log_r_BT = _log_ratio(inp)
    log_s_B = masked_mean(log_r_BT, inp.mask_BT, dim=-1)
    log_s_BT = log_s_B.detach()[:, None] + inp.logp_BT - inp.logp_BT.detach()
    log_s_BT = torch.where(inp.mask_BT > 0, log_s_BT, 0.0)
    loss_BT, active_BT = _clipped_surrogate(log_s_BT.exp(), inp.advantages_BT, cfg)
    return _finish(loss_BT, weights, active_BT, inp, cfg)


@register_policy_loss("cispo")
def cispo(inp: PolicyLossInputs, cfg: PolicyLossSettings) -> PolicyLossOut:
    """CISPO (MiniMax-M1, 2025): loss_t = -w_t sg(clip(r_t, 1-eps_lo, 1+eps_hi)) A_t logp_t.

    The ratio is clipped inside a stop-gradient, so clipped tokens still get a (bounded) gradient;
    clip_frac counts tokens whose ratio was outside the range.
    """
    weights = _weights(inp, cfg)
    ratio_BT = _log_ratio(inp).exp().detach()
    coef_BT = ratio_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    loss_BT = -coef_BT * inp.advantages_BT * inp.logp_BT
    return _finish(loss_BT, weights, coef_BT != ratio_BT, inp, cfg)


def value_loss(values_BT: torch.Tensor, old_values_BT: torch.Tensor, returns_BT: torch.Tensor,
               mask_BT: torch.Tensor, clip: float | None = None,
               agg: str = "token_mean") -> tuple[torch.Tensor, dict[str, float]]:
    """Critic loss 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2) (PPO2 / OpenRLHF
    ValueLoss); without `clip` it is 0.5 (V - R)^2. Returns (loss, {"vf_clip_frac"})."""
    returns_BT = returns_BT.detach()
    loss_BT = (values_BT - returns_BT) ** 2
    active_BT = torch.zeros_like(mask_BT, dtype=torch.bool)
    if clip is not None:
        old_BT = old_values_BT.detach()
        clipped_BT = (old_BT + (values_BT - old_BT).clamp(-clip, clip) - returns_BT) ** 2
        active_BT = clipped_BT > loss_BT
        loss_BT = torch.maximum(loss_BT, clipped_BT)
    loss = 0.5 * aggregate(loss_BT, mask_BT, agg)
    return loss, {"vf_clip_frac": float(masked_mean(active_BT.to(mask_BT.dtype), mask_BT))}
