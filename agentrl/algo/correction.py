"""Off-policy correction: the importance weight w = pi_old / mu and its diagnostics.

mu is the behaviour policy that sampled the tokens (logprobs recorded by vLLM); pi_old is the
denominator of the PPO ratio (the proximal policy recomputed by the learner in decoupled mode, or mu
itself in bypass mode, where w = 1). Decoupled PPO: Hilton et al. 2022, "Batch size-invariance for
policy optimization"; AReaL (Fu et al. 2025). Truncated IS: Espeholt et al. 2018 (IMPALA), Yao et
al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training", TIS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CORRECTIONS = ("none", "tis", "mask")
CORRECTION_LEVELS = ("token", "sequence")


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
                       correction: str, level: str, is_low: float, is_high: float) -> ImportanceWeights:
    """w = pi_old / mu = exp(old_logp - behav_logp), detached, at token or sequence level.

    Sequence level: w_i = exp(mean_{t in y_i} log w_t), the geometric mean of the token weights
    (length-normalised, as in GSPO). Corrections:
      none: w is reported but not applied (weight 1);
      tis:  w <- min(w, is_high)                              (truncated IS);
      mask: w <- w if is_low <= w <= is_high else 0           (masked IS; AReaL's behaviour cap).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; expected one of {CORRECTIONS}")
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"unknown correction level {level!r}; expected one of {CORRECTION_LEVELS}")
    log_w_BT = torch.where(mask_BT > 0, old_logp_BT.detach() - behav_logp_BT.detach(), 0.0)
    if level == "sequence":
        unit_mask_U = (mask_BT.sum(-1) > 0).to(mask_BT.dtype)
        raw_U = masked_mean(log_w_BT, mask_BT, dim=-1).exp()
    else:
        unit_mask_U = mask_BT
        raw_U = log_w_BT.exp()
    if correction == "none":
        applied_U, corrected_U = torch.ones_like(raw_U), torch.zeros_like(raw_U, dtype=torch.bool)
    elif correction == "tis":
        applied_U, corrected_U = raw_U.clamp(max=is_high), raw_U > is_high
    else:
        corrected_U = (raw_U < is_low) | (raw_U > is_high)
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
