"""Pure RL math over tensors (imports only torch): advantage estimators, policy losses, corrections.

Call sites pick an entry from a registry by its config name and call it with one typed input:
    ADVANTAGES[name](AdvantageInputs(...)) -> AdvantageOutput
    POLICY_LOSSES[name](PolicyLossInputs(...), PolicyLossConfig(...)) -> (loss, metrics)
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

__all__ = [
    "ADVANTAGES",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "AdvantageOutput",
    "ImportanceWeights",
    "PolicyLossConfig",
    "PolicyLossInputs",
    "aggregate",
    "correction_metrics",
    "importance_weights",
    "kl_estimate",
    "masked_mean",
    "register_advantage",
    "register_policy_loss",
    "value_loss",
]
