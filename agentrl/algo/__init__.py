"""Pure RL math over tensors (imports only torch): advantage estimators, policy losses, corrections,
reward shaping, KL control, on-policy distillation, and the preference (DPO, IPO, KTO) and reward-model losses.

Call sites pick an entry from a registry by its config name and call it with one typed input:
    ADVANTAGES[name](AdvantageInputs(...)) -> AdvantageOutput
    POLICY_LOSSES[name](PolicyLossInputs(...), settings) -> PolicyLossOut (loss, metrics, keep-mask, causes); settings:
        the config's `algo`
    make_kl_controller(kind, kl_coef, target, horizon) -> KLController
    PREFERENCE_LOSSES[name](policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=...) -> PreferenceLoss
"""

from .advantages import ADVANTAGES, AdvantageInputs, AdvantageOutput, register_advantage
from . import turn_baseline  # noqa: F401  (registers the turn_grpo and state_grpo estimators)
from .correction import (TOKEN_CAUSES, CorrectionSettings, ImportanceWeights, TrustRegionSettings, behaviour_trust_mask,
                         correction_metrics, importance_weights, masked_mean, staleness_buckets, token_causes)
from .losses import (
    POLICY_LOSSES,
    PolicyLossOut,
    PolicyLossSettings,
    PolicyLossInputs,
    aggregate,
    kl_estimate,
    register_policy_loss,
    step_kl,
    value_loss,
)
from .distill import combine_advantages, distill_advantages, distill_metrics
from .preference import (
    PREFERENCE_LOSSES,
    PreferenceLoss,
    bradley_terry,
    dpo,
    ipo,
    kto,
    prm_step_scores,
    prm_token_loss,
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
    sequence_kl,
)

__all__ = [
    "ADVANTAGES",
    "KL_CONTROLLER_KINDS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageOutput",
    "CorrectionSettings",
    "FixedKLController",
    "ImportanceWeights",
    "KLController",
    "PolicyLossSettings",
    "PolicyLossInputs",
    "PolicyLossOut",
    "PreferenceLoss",
    "RunningMoments",
    "TOKEN_CAUSES",
    "TrustRegionSettings",
    "aggregate",
    "behaviour_trust_mask",
    "token_causes",
    "bradley_terry",
    "clip_rewards",
    "combine_advantages",
    "correction_metrics",
    "distill_advantages",
    "distill_metrics",
    "dpo",
    "importance_weights",
    "informative_groups",
    "ipo",
    "kl_estimate",
    "kl_penalized_token_rewards",
    "sequence_kl",
    "kto",
    "make_kl_controller",
    "masked_mean",
    "prm_step_scores",
    "prm_token_loss",
    "register_advantage",
    "register_policy_loss",
    "staleness_buckets",
    "step_kl",
    "value_loss",
]
