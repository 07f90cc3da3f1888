"""Reward shaping and KL control: KL-penalised token rewards, reward clipping and running
normalisation, KL-coefficient controllers, and DAPO's dynamic filtering of uninformative groups.

Shapes: B episodes (rows), T ledger positions; `mask_BT` is float, 1 on policy-generated tokens
(multi-turn rows have gaps of env tokens with mask 0). Rewards are targets, never differentiated:
every function here returns detached tensors.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import torch

from .advantages import _last_token_rewards

KL_CONTROLLER_KINDS = ("fixed", "adaptive")


def clip_rewards(rewards_B: torch.Tensor, clip: float | None) -> torch.Tensor:
    """clamp(r, -clip, clip); None leaves rewards unchanged (DeepSpeed-Chat's `clip_reward_value`)."""
    if clip is None:
        return rewards_B
    if not clip > 0:
        raise ValueError(f"reward clip must be > 0, got {clip}")
    return rewards_B.clamp(-clip, clip)


@torch.no_grad()
def kl_penalized_token_rewards(rewards_B: torch.Tensor, logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor,
                               mask_BT: torch.Tensor, kl_coef: float,
                               reward_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards with an in-reward KL penalty (DeepSpeed-Chat `compute_rewards`; Ziegler et
    al. 2019; Ouyang et al. 2022):
        kl_t = log pi(y_t) - log ref(y_t)                                   (k1 estimate, masked)
        r_t  = -kl_coef * kl_t + [t = last generated token] * clip(R, -c, c)
    Returns (token_rewards_BT, kl_BT), both 0 where mask is 0; a row without generated tokens gets
    no reward at all. Feed token_rewards_BT to GAE (`AdvantageInputs.token_rewards_BT`). Padding
    may hold garbage (inf/NaN): it is selected away, not multiplied by 0.
    """
    kl_BT = torch.where(mask_BT > 0, logp_BT.detach() - ref_logp_BT.detach(), 0.0) * mask_BT
    final_BT = _last_token_rewards(clip_rewards(rewards_B.detach(), reward_clip), mask_BT)
    return -kl_coef * kl_BT + final_BT.to(kl_BT.dtype), kl_BT


def sequence_kl(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Mean over rows of the summed k1 estimate log pi - log ref over each row's masked tokens."""
    return float(torch.where(mask_BT > 0, logp_BT - ref_logp_BT, 0.0).sum(-1).mean())


class RunningMoments:
    """Running mean and variance of scalar rewards across batches, float64.

    Batches are merged with the parallel algorithm of Chan et al. 1979 (Welford for batches):
        n = n_a + n_b,  d = mean_b - mean_a,  mean = mean_a + d n_b / n,
        M2 = M2_a + M2_b + d^2 n_a n_b / n
    `var` is the population variance M2 / n (np.var); `std` is the unbiased sqrt(M2 / (n - 1)),
    as trl's RunningMoments.std and torch.std, and 0 while fewer than 2 values were seen.
    """

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the running mean

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    @torch.no_grad()
    def update(self, x_B: torch.Tensor) -> None:
        """Merge the values of x_B (any shape, flattened) into the running moments."""
        x = x_B.detach().double().flatten()
        n_b = x.numel()
        if n_b == 0:
            return
        mean_b = float(x.mean())
        m2_b = float(((x - mean_b) ** 2).sum())
        n = self.count + n_b
        delta = mean_b - self.mean
        self.m2 += m2_b + delta**2 * self.count * n_b / n
        self.mean += delta * n_b / n
        self.count = n

    @torch.no_grad()
    def normalize(self, x_B: torch.Tensor, subtract_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
        """Update with x_B, then return (x - mean) / (std + eps) (x / (std + eps) without
        subtract_mean) using the moments AFTER including this batch, in x_B's dtype.

        This is trl's order (PPOTrainer `use_score_scaling` / `use_score_norm`: `running.update(scores)`,
        then scale by `running.std + eps`), so the first batch is whitened by its own statistics.
        """
        self.update(x_B)
        x = x_B.detach().double()
        if subtract_mean:
            x = x - self.mean
        return (x / (self.std + eps)).to(x_B.dtype)

    def state_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        if set(state) != {"count", "mean", "m2"}:
            raise ValueError(f"RunningMoments state needs keys count, mean, m2; got {sorted(state)}")
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


class KLController(Protocol):
    """Holds the current KL coefficient `value`; `update` is called once per training step."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: dict[str, float]) -> None: ...


class _Coefficient:
    """The checkpointed state shared by the controllers: the current coefficient."""

    def __init__(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {value}")
        self.value = float(value)

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class FixedKLController(_Coefficient):
    """A constant KL coefficient; `update` is a no-op."""

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController(_Coefficient):
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences", sec. 2.2; trl / DeepSpeed-Chat `AdaptiveKLController`), a proportional controller
    steering the observed KL towards `target`:
        e = clip(current_kl / target - 1, -0.2, 0.2),   value <- value * (1 + e * n_steps / horizon)
    n_steps is the number of samples (trl: batch size) since the last update.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        if not (target > 0 and horizon > 0):
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got {target}, {horizon}")
        super().__init__(init_kl_coef)
        self.target, self.horizon = float(target), float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def _adaptive(kl_coef: float, target: float | None, horizon: float | None) -> KLController:
    if target is None or horizon is None:
        raise ValueError("the adaptive KL controller needs target and horizon")
    return AdaptiveKLController(kl_coef, target, horizon)


# one signature for every kind: (kl_coef, target, horizon); kinds ignore what they do not use
_KL_CONTROLLERS: dict[str, Callable[[float, float | None, float | None], KLController]] = {
    "fixed": lambda kl_coef, target, horizon: FixedKLController(kl_coef),
    "adaptive": _adaptive,
}


def make_kl_controller(kind: str, kl_coef: float, target: float | None = None,
                       horizon: float | None = None) -> KLController:
    """"fixed" -> FixedKLController(kl_coef) (target and horizon ignored); "adaptive" ->
    AdaptiveKLController(kl_coef, target, horizon) (both required)."""
    if kind not in _KL_CONTROLLERS:
        raise ValueError(f"unknown KL controller {kind!r}; expected one of {KL_CONTROLLER_KINDS}")
    return _KL_CONTROLLERS[kind](kl_coef, target, horizon)


@torch.no_grad()
def informative_groups(rewards_B: torch.Tensor, group_ids_B: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """DAPO dynamic sampling (Yu et al. 2025): bool (B,), True for episodes whose group's rewards
    are not all equal, i.e. max_g(r) - min_g(r) > eps. A group whose rewards are all equal (all
    solved or all failed) has zero group-relative advantage and only dilutes the batch; a group of
    one is never informative. Group ids are arbitrary, not contiguous.
    """
    _, inv_B = torch.unique(group_ids_B, return_inverse=True)
    n_groups = int(inv_B.max()) + 1 if inv_B.numel() else 0
    r_B = rewards_B.detach().double()
    hi_G = r_B.new_full((n_groups,), -math.inf).scatter_reduce(0, inv_B, r_B, "amax")
    lo_G = r_B.new_full((n_groups,), math.inf).scatter_reduce(0, inv_B, r_B, "amin")
    return (hi_G - lo_G)[inv_B] > eps
