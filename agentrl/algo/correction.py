"""Off-policy correction: the importance weight w = pi_old / mu and its diagnostics.

mu is the behaviour policy that sampled the tokens (logprobs recorded by vLLM); pi_old is the
denominator of the PPO ratio (the proximal policy recomputed by the learner in decoupled mode, or mu
itself in bypass mode, where w = 1). Decoupled PPO: Hilton et al. 2022, "Batch size-invariance for
policy optimization"; AReaL (Fu et al. 2025). Truncated IS: Espeholt et al. 2018 (IMPALA), Yao et
al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training", TIS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

CORRECTIONS = ("none", "tis", "mask")
CORRECTION_LEVELS = ("token", "sequence")
TRUST_REGIONS = ("none", "clip", "neg_clip", "m2")


class CorrectionSettings(Protocol):
    """The config tree's `algo.correction` (agentrl.config.algo): a type and only the settings it has.
    none: nothing more; tis: `level`, `high`; mask: `level`, `low`, `high`."""

    type: str


class TrustRegionSettings(Protocol):
    """The config tree's `algo.trust_region` (agentrl.config.algo): a type and only the bounds it has.
    none: nothing more; clip: `eps_low`, `eps_high`, `half_life` (None: fixed bounds), `level` (token or
    sequence); neg_clip: `eps_low`; m2: `tau`."""

    type: str


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * mask) / sum(mask) over `dim` (all dims if None); 0 where the mask sums to 0."""
    x = torch.where(mask > 0, x, 0.0)  # keeps inf/NaN at masked-out positions out of the sum
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1e-8)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1e-8)


@dataclass
class ImportanceWeights:
    """The weight applied to each token's loss plus the raw weights it came from."""

    weight_BT: torch.Tensor  # (B, T) detached weight applied to the loss (after truncation/masking)
    raw_U: torch.Tensor  # raw w per unit: (B, T) tokens or (B,) sequences
    unit_mask_U: torch.Tensor  # (B, T) token mask or (B,) 1 for rows with any masked token
    corrected_U: torch.Tensor  # bool, units whose weight was truncated or masked


def importance_weights(old_logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                       correction: CorrectionSettings, level: str | None = None) -> ImportanceWeights:
    """w = pi_old / mu = exp(old_logp - behav_logp), detached, at token or sequence level (`level`, else
    the correction's own; token for `none`, whose weight is only reported).

    Sequence level: w_i = exp(mean_{t in y_i} log w_t), the geometric mean of the token weights
    (length-normalised, as in GSPO). Corrections (`correction.type`):
      none: w is reported but not applied (weight 1);
      tis:  w <- min(w, high)                                 (truncated IS);
      mask: w <- w if low <= w <= high else 0                 (masked IS; AReaL's behaviour cap).
    """
    kind = correction.type
    if kind not in CORRECTIONS:
        raise ValueError(f"unknown correction {kind!r}; expected one of {CORRECTIONS}")
    level = level or ("token" if kind == "none" else correction.level)
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"unknown correction level {level!r}; expected one of {CORRECTION_LEVELS}")
    log_w_BT = torch.where(mask_BT > 0, old_logp_BT.detach() - behav_logp_BT.detach(), 0.0)
    if level == "sequence":
        unit_mask_U = (mask_BT.sum(-1) > 0).to(mask_BT.dtype)
        raw_U = masked_mean(log_w_BT, mask_BT, dim=-1).exp()
    else:
        unit_mask_U = mask_BT
        raw_U = log_w_BT.exp()
    if kind == "none":
        applied_U, corrected_U = torch.ones_like(raw_U), torch.zeros_like(raw_U, dtype=torch.bool)
    elif kind == "tis":
        applied_U, corrected_U = raw_U.clamp(max=correction.high), raw_U > correction.high
    else:
        corrected_U = (raw_U < correction.low) | (raw_U > correction.high)
        applied_U = torch.where(corrected_U, 0.0, raw_U)
    corrected_U = corrected_U & (unit_mask_U > 0)
    weight_BT = applied_U[:, None].expand_as(mask_BT) if level == "sequence" else applied_U
    return ImportanceWeights(weight_BT, raw_U, unit_mask_U, corrected_U)


@torch.no_grad()
def correction_metrics(iw: ImportanceWeights, old_logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor,
                       mask_BT: torch.Tensor) -> dict[str, float]:
    """Diagnostics of the raw weight over its units (masked tokens, or non-empty sequences).

    is_ess = (sum w)^2 / (n * sum w^2), the normalised effective sample size (Kong 1992), 1 when all
    weights are equal. mismatch_k1 = mean_t (log mu - log pi_old), the k1 estimate of KL(mu || pi_old)
    with samples from mu; mismatch_abs = mean_t |log pi_old - log mu|; both over masked tokens.
    """
    keep_U = iw.unit_mask_U > 0
    w_U = iw.raw_U[keep_U].double()
    n = max(w_U.numel(), 1)
    diff_BT = (behav_logp_BT - old_logp_BT).double()
    out = {
        "is_weight_mean": float(w_U.sum() / n),
        "is_weight_max": float(w_U.max()) if w_U.numel() else 0.0,
        "is_weight_min": float(w_U.min()) if w_U.numel() else 0.0,
        "is_corrected_frac": float(iw.corrected_U[keep_U].double().sum() / n),
        "is_ess": float(w_U.sum() ** 2 / (n * (w_U**2).sum()).clamp_min(1e-300)) if w_U.numel() else 0.0,
        "mismatch_k1": float(masked_mean(diff_BT, mask_BT)),
        "mismatch_abs": float(masked_mean(diff_BT.abs(), mask_BT)),
    }
    return out



def staleness_buckets(old_logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                      staleness_BT: torch.Tensor, correction: CorrectionSettings) -> dict[str, float]:
    """Correction diagnostics per staleness bucket (learner version minus token version), e.g.
    `stale2/is_ess`: how far behaviour and proximal policies drift as samples age."""
    out: dict[str, float] = {}
    for s in sorted(set(staleness_BT[mask_BT > 0].tolist())):
        mask = mask_BT * (staleness_BT == s)
        iw = importance_weights(old_logp_BT, behav_logp_BT, mask, correction)
        for key, val in correction_metrics(iw, old_logp_BT, behav_logp_BT, mask).items():
            if key in ("is_ess", "is_corrected_frac", "mismatch_k1", "mismatch_abs"):
                out[f"stale{s}/{key}"] = val
        out[f"stale{s}/tokens"] = float(mask.sum())
    return out


# Why a scored token was or was not trained, as the policy loss decided it (`token_causes`; the learner
# records it beside each trained episode, agentrl.learner.rl `token_values["cause"]`): the code is the index.
# 6 and 7 are the learner's (a row the step never trained), not a loss's.
TOKEN_CAUSES = (
    "kept",                                  # 0: trained with its importance weight
    "masked: trust region, A < 0 side",      # 1: rho below the low bound while the advantage pushes it down
    "masked: trust region, A > 0 side",      # 2: rho above the high bound while the advantage pushes it up
    "masked: trust region",                  # 3: m2 (by |log rho| either way), or a sequence's decision where A = 0
    "kept: importance weight capped",        # 4: tis truncated w to `high`: trained, with less weight
    "masked: importance weight zeroed",      # 5: mask correction: w outside [low, high] becomes 0
    "not trained: target_kl stopped the step",  # 6: the step ended before this row's mini-batch
    "not trained: the actor was frozen",     # 7: learner.freeze_actor_steps
)


def token_causes(keep_BT: torch.Tensor, iw: ImportanceWeights, adv_BT: torch.Tensor,
                 mask_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) int8 TOKEN_CAUSES codes of scored tokens (0 off the mask) from the trust region's keep-mask
    and the importance weights the loss applied: a token the trust region masked is reported by its side
    (the advantage's sign), whatever its weight; else a weight the correction zeroed or capped; else kept."""
    corrected_BT = iw.corrected_U[:, None].expand_as(mask_BT) if iw.corrected_U.dim() == 1 else iw.corrected_U
    masked_BT, adv_BT = keep_BT == 0, adv_BT.detach()
    cause_BT = torch.zeros(mask_BT.shape, dtype=torch.int8, device=mask_BT.device)
    cause_BT[corrected_BT & (iw.weight_BT > 0)] = 4
    cause_BT[corrected_BT & (iw.weight_BT == 0)] = 5
    cause_BT[masked_BT] = 3
    cause_BT[masked_BT & (adv_BT < 0)] = 1
    cause_BT[masked_BT & (adv_BT > 0)] = 2
    return torch.where(mask_BT > 0, cause_BT, torch.zeros_like(cause_BT))


def behaviour_trust_mask(logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor, adv_BT: torch.Tensor,
                         mask_BT: torch.Tensor, region: TrustRegionSettings,
                         age_BT: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) detached 0/1 keep-mask: a trust region around the behaviour policy mu.

    With one optimizer step per batch, decoupled PPO's ratio r = pi_theta / pi_prox is exactly 1 where
    the gradient is taken, so its clip never acts and nothing bounds how far a stale batch pushes the
    policy from the one that sampled it. These rules (`region.type`, each with bounds of its own, not
    PPO's clip) act on rho_t = pi_theta(y_t) / mu(y_t) instead (pi_theta = pi_prox at the first
    mini-batch, so rho = w there), at any number of mini-batches:
      clip:     drop tokens whose rho has left [1 - eps_low, 1 + eps_high] in the direction the advantage
                pushes: A < 0 and rho < 1 - eps_low, or A > 0 and rho > 1 + eps_high. That is PPO's own
                clip (Schulman et al. 2017) anchored at mu, as in verl's and OpenRLHF's "bypass" mode.
      neg_clip: only the A < 0 side of `clip`. Pushing a token up is self-limiting (d log p / d logit =
                1 - p -> 0 as p -> 1); pushing one down is not, and the tokens that drove the measured
                collapse were A < 0 tokens already cut below mu (bench/staleness.py; docs/benchmarks.md, "Staleness").
      m2:       M2PO (Zheng et al. 2025, "Prosperity before Collapse"): drop the tokens with the largest
                (log rho)^2 until the mean over the kept ones is <= tau, a bound on the second moment
                of the log importance ratio; both directions, whatever the advantage.
                With `half_life`, its bounds tighten with the token's age a (learner version minus the
                version that sampled it; `age_BT`, 0 when not given): eps(a) = eps * 2^(-a / half_life)
                (`age_scaled_eps`); on-policy tokens (a = 0) get the fixed bounds. With `level: sequence`,
                rho_i = exp(mean_t log rho_t) and A_i = mean_t A_t decide for every token of the sequence,
                a trust region for GSPO (`sequence_trust_keep`).
      none:     keep every token.
    """
    kind = region.type
    if kind not in TRUST_REGIONS:
        raise ValueError(f"unknown trust region {kind!r}; expected one of {TRUST_REGIONS}")
    on_BT = mask_BT > 0
    log_rho_BT = torch.where(on_BT, logp_BT.detach() - behav_logp_BT.detach(), 0.0)
    if kind == "none":
        return mask_BT.new_ones(mask_BT.shape)
    if kind == "m2":
        return _m2_keep(log_rho_BT**2, on_BT, region.tau).to(mask_BT.dtype)
    adv_BT = adv_BT.detach()
    if kind == "clip" and getattr(region, "level", "token") == "sequence":
        return sequence_trust_keep(log_rho_BT, adv_BT, mask_BT, region.eps_low, region.eps_high)
    if kind == "clip" and getattr(region, "half_life", None) is not None:
        age_BT = torch.zeros_like(log_rho_BT) if age_BT is None else age_BT.to(log_rho_BT.dtype).clamp_min(0)
        # log1p(-1) = -inf: a bound of 1 below drops nothing (rho >= 0)
        low_BT = torch.log1p(-age_scaled_eps(region.eps_low, age_BT, region.half_life).clamp(max=1.0))
        high_BT = torch.log1p(age_scaled_eps(region.eps_high, age_BT, region.half_life))
        drop_BT = ((adv_BT < 0) & (log_rho_BT < low_BT)) | ((adv_BT > 0) & (log_rho_BT > high_BT))
        return (~(drop_BT & on_BT)).to(mask_BT.dtype)
    eps_low = region.eps_low
    drop_BT = (adv_BT < 0) & (log_rho_BT < math.log1p(-eps_low)) if eps_low < 1 else torch.zeros_like(on_BT)
    if kind == "clip":
        drop_BT = drop_BT | ((adv_BT > 0) & (log_rho_BT > math.log1p(region.eps_high)))
    return (~(drop_BT & on_BT)).to(mask_BT.dtype)


def age_scaled_eps(eps: float, age_BT: torch.Tensor, half_life: float) -> torch.Tensor:
    """eps(a) = eps * 2^(-a / half_life): a trust-region bound that halves every `half_life` versions of
    age. A token sampled a versions ago has had a optimizer steps of drift between mu and pi_prox already;
    the older it is, the less of its log-ratio is signal about the current policy, so the less room it
    gets (the failure this tightens against: stale A < 0 tokens pushed ever further below mu)."""
    return eps * torch.exp2(-age_BT / half_life)


def sequence_trust_keep(log_rho_BT: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor,
                        eps_low: float, eps_high: float) -> torch.Tensor:
    """(B, T) keep-mask of `clip` taken per sequence: rho_i = exp(mean_{t in y_i} log rho_t) (GSPO's
    length-normalised ratio, anchored at mu), A_i = mean_{t in y_i} A_t; row i is dropped when A_i < 0
    and rho_i < 1 - eps_low, or A_i > 0 and rho_i > 1 + eps_high. Rows without tokens are kept."""
    log_rho_B = masked_mean(log_rho_BT, mask_BT, dim=-1)
    adv_B = masked_mean(adv_BT, mask_BT, dim=-1)
    low = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    drop_B = ((adv_B < 0) & (log_rho_B < low)) | ((adv_B > 0) & (log_rho_B > math.log1p(eps_high)))
    return (~drop_B)[:, None].expand_as(mask_BT).to(mask_BT.dtype)


def ess_step_scale(iw: ImportanceWeights) -> float:
    """VCPO's step scale (variance-controlled off-policy RL): the normalised effective sample size of the
    raw importance weights, (sum w)^2 / (n sum w^2) over their units, in (0, 1]; the loss (so the step,
    with SGD; with Adam, the part of the update the moment estimates do not absorb) is multiplied by it,
    so a batch whose weights are dominated by a few tokens moves the policy less. 1 with no units."""
    w_U = iw.raw_U[iw.unit_mask_U > 0].double()
    if w_U.numel() == 0:
        return 1.0
    return float(w_U.sum() ** 2 / (w_U.numel() * (w_U**2).sum()).clamp_min(1e-300))


def _m2_keep(sq_BT: torch.Tensor, on_BT: torch.Tensor, tau: float) -> torch.Tensor:
    """Bool keep-mask: among tokens where on_BT, drop the k largest values of sq_BT, k the least for
    which the mean of the rest is <= tau (0 when the mean of all already is; all when even the smallest
    exceeds tau). Equal values are dropped in position order."""
    vals = sq_BT[on_BT]
    n = vals.numel()
    keep = torch.zeros_like(on_BT)
    if n == 0:
        return keep
    order = torch.argsort(vals, descending=True, stable=True)
    suffix_sum = vals[order].flip(0).cumsum(0).flip(0)  # [k]: sum of all but the k largest
    suffix_mean = suffix_sum / torch.arange(n, 0, -1, dtype=vals.dtype, device=vals.device)
    within = torch.nonzero(suffix_mean <= tau)  # non-increasing in k: the first is the least k
    k = int(within[0]) if within.numel() else n
    kept = torch.ones(n, dtype=torch.bool, device=vals.device)
    kept[order[:k]] = False
    keep[on_BT] = kept
    return keep
