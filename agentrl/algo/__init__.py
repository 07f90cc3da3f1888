"""Pure RL math over tensors (imports only torch): advantage estimators, policy losses, corrections,
reward shaping and KL control.

Call sites pick an entry from a registry by its config name and call it with one typed input:
    ADVANTAGES[name](AdvantageInputs(...)) -> AdvantageOutput
    POLICY_LOSSES[name](PolicyLossInputs(...), PolicyLossConfig(...)) -> (loss, metrics)
    make_kl_controller(kind, kl_coef, target, horizon) -> KLController
"""

from .advantages import ADVANTAGES, AdvantageInputs, AdvantageOutput, register_advantage
from .correction import ImportanceWeights, correction_metrics, importance_weights, masked_mean
from .losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossInputs,
    aggregate,
    kl_estimate,
    register_policy_loss,
    value_loss,
)
from .shaping import (
    KL_CONTROLLER_KINDS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    RunningMoments,
    clip_rewards,
    informative_groups,
    kl_penalized_token_rewards,
    make_kl_controller,
)

__all__ = [
    "ADVANTAGES",
    "KL_CONTROLLER_KINDS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageOutput",
    "FixedKLController",
    "ImportanceWeights",
    "KLController",
    "PolicyLossConfig",
    "PolicyLossInputs",
    "RunningMoments",
    "aggregate",
    "clip_rewards",
    "correction_metrics",
    "importance_weights",
    "informative_groups",
    "kl_estimate",
    "kl_penalized_token_rewards",
    "make_kl_controller",
    "masked_mean",
    "register_advantage",
    "register_policy_loss",
    "value_loss",
]
