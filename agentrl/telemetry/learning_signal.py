"""Whether a run has anything to learn from, said out loud.

A group whose episodes all got the same reward (all solved, or, for a model that never succeeds, all
0) has zero group-relative advantage: GRPO, Dr. GRPO, RLOO and REINFORCE++ with a group baseline
change nothing on it. When (nearly) every group of several steps in a row is like that, or the reward
never varies at all (which no estimator can learn from), the run prints one warning naming the cause
and what to do, instead of training at 0.000 to the end in silence.

Every step's record carries `signal/zero_std_groups_frac` (groups dynamic_filter dropped count as
such: they were dropped for it) and `signal/reward_range`; the summary carries the run's share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from agentrl.algo import informative_groups
from agentrl.types import Group

WINDOW = 5  # steps in a row
SHARE = 0.9  # of groups with equal rewards in each of them
# Estimators whose advantage is the reward against the episode's own group: zero on an equal group.
GROUP_BASELINES = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"})
WHAT_TO_DO = ("give the model tasks it sometimes solves: warm-start it on the task (model.default, or an SFT "
              "checkpoint: python -m agentrl.sft), easier tasks (data.task_kwargs), more samples per task "
              "(rollout.n_samples), or a shaped reward with partial credit (rewards.sources); "
              "python -m agentrl.check shows what the model sees and how it is scored")


class NoLearningSignal(RuntimeError):
    """dynamic_filter dropped every group for `filter_streak_limit` groups in a row: no batch can fill."""


def filter_streak_limit(groups_per_batch: int) -> int:
    """Groups dynamic_filter may drop in a row before the run ends: 16 batches' worth, and at least 256, so
    that a task whose groups carry a signal one time in 20 still gets one through (0.95 ** 256 < 2e-6)."""
    return max(256, 16 * groups_per_batch)


def filter_streak_cause(dropped: int, rewards: set[float]) -> str:
    """What a streak of groups dropped by dynamic_filter means; `rewards`: the rewards those groups got."""
    seen = ", ".join(f"{r:g}" for r in sorted(rewards)[:8]) + (", ..." if len(rewards) > 8 else "")
    return (f"no learning signal: algo.dynamic_filter dropped the last {dropped} groups in a row, each for "
            f"giving every sample the same reward (rewards seen: {seen}), so no batch could be filled")


@dataclass(frozen=True)
class StepSignal:
    """What one learner batch offers to learn from."""

    groups: int  # groups trained, plus those dynamic_filter dropped
    equal_groups: int  # of them, groups whose trainable episodes all got the same reward
    reward_min: float
    reward_max: float

    @property
    def equal_frac(self) -> float:
        return self.equal_groups / self.groups if self.groups else 0.0


def step_signal(groups: list[Group], filtered: int = 0) -> StepSignal:
    """The signal of a batch's groups; `filtered`: groups dropped by dynamic_filter for equal rewards."""
    rewards, ids = [], []
    for g in groups:
        for e in g.episodes:
            if e.trainable:
                rewards.append(e.reward)
                ids.append(g.group_id)
    trained = {g.group_id for g in groups if any(e.trainable for e in g.episodes)}
    if not rewards:
        return StepSignal(filtered, filtered, 0.0, 0.0)
    spread = informative_groups(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids))
    varied = {i for i, s in zip(ids, spread.tolist()) if s}
    return StepSignal(len(trained) + filtered, len(trained - varied) + filtered, min(rewards), max(rewards))


@dataclass
class SignalWatch:
    """Follows the steps' signal; `observe` returns the warning once, when the signal has been missing
    for `window` steps in a row."""

    advantage: str
    window: int = WINDOW
    share: float = SHARE
    groups: int = 0
    equal_groups: int = 0
    warned_at: int | None = None
    _recent: list[StepSignal] = field(default_factory=list)

    def observe(self, step: int, sig: StepSignal) -> str | None:
        self.groups += sig.groups
        self.equal_groups += sig.equal_groups
        self._recent = (self._recent + [sig])[-self.window:]
        if self.warned_at is not None or len(self._recent) < self.window:
            return None
        lo, hi = min(s.reward_min for s in self._recent), max(s.reward_max for s in self._recent)
        if hi - lo <= 1e-6:
            cause = f"every episode of the last {self.window} steps got reward {lo:g}: no estimator learns " \
                    f"from a reward that never varies"
        elif self.advantage in GROUP_BASELINES and all(s.equal_frac >= self.share for s in self._recent):
            frac = sum(s.equal_groups for s in self._recent) / max(sum(s.groups for s in self._recent), 1)
            cause = f"in the last {self.window} steps {frac:.0%} of groups got the same reward for every " \
                    f"sample, so algo.advantage={self.advantage} gives them all advantage 0 and the policy " \
                    f"barely changes"
        else:
            return None
        self.warned_at = step
        return f"no learning signal: {cause}. What to do: {WHAT_TO_DO}"

    def summary(self) -> dict[str, float | int | None]:
        return {"equal_reward_groups_frac": self.equal_groups / self.groups if self.groups else 0.0,
                "warned_at_step": self.warned_at}


def signal_metrics(sig: StepSignal) -> dict[str, float]:
    return {"signal/zero_std_groups_frac": sig.equal_frac, "signal/reward_range": sig.reward_max - sig.reward_min}
