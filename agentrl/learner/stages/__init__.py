"""The stage kinds run by `agentrl.learner.stage.run_stage`: what each stage loads, batches and minimises."""

from agentrl.learner.stages.preference import DPOKind, KTOKind
from agentrl.learner.stages.reward import PRMKind, RewardKind
from agentrl.learner.stages.sft import SFTKind

__all__ = ["DPOKind", "KTOKind", "PRMKind", "RewardKind", "SFTKind"]
