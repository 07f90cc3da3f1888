"""Reward sources: rule functions, reward-model scorers and HTTP verifiers, all returning RewardResult."""

from rewards.base import RewardFn, RewardResult

__all__ = ["RewardFn", "RewardResult"]
