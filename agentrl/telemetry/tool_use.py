"""Tool calls that actually fire: a warning when a run's reward rises while its episodes stop calling tools.

Agents that learn to skip their tools and are still rewarded (a guess that is often close enough, an
answer memorised from the training stream, a reward the tool is not needed for) are a known failure
of agentic RL: the curve goes up and the agent it trains is not the one wanted. Every step's record
carries `tools/no_call_episode_frac` (`agentrl.rollout.tools.counts.ToolCallStats`, episodes of the
step with no parsed call); `tool_use_metrics` adds its complement `tools/call_episode_frac`, the share
of episodes with at least one tool call, and `ToolUseWatch.observe` compares the first and second half
of the last `window` steps:

    reward_rise = mean(reward, second half) - mean(reward, first half)
    share_drop  = mean(call share, first half) - mean(call share, second half)

and returns a warning when reward_rise >= `min_reward_rise` and share_drop >= `min_share_drop`. Halves,
not end points: one noisy batch neither raises nor hides it. A step without a share (no model turn,
an env without tools: NaN) leaves the window empty, so envs that never call tools never warn. After a
warning the watch is quiet for `window` steps, then watches again.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

WINDOW = 10  # steps compared (two halves of 5)
MIN_REWARD_RISE = 0.05
MIN_SHARE_DROP = 0.2
WHAT_TO_DO = ("make the reward need the tool (tasks the model cannot answer without it: data.task_kwargs), "
              "look at what the episodes do (python -m agentrl.check --config <config>), or add a reward for "
              "a tool call that ran (rewards.sources)")


def call_episode_frac(record: dict[str, Any]) -> float:
    """Share of a step's episodes with at least one parsed tool call (NaN when the step had none to count)."""
    no_call = record.get("tools/no_call_episode_frac")
    return math.nan if no_call is None or not math.isfinite(no_call) else 1.0 - no_call


def tool_use_metrics(record: dict[str, Any]) -> dict[str, float]:
    return {"tools/call_episode_frac": call_episode_frac(record)}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@dataclass(frozen=True)
class ToolUseDrop:
    """What the watch saw over steps first..last."""

    first: int
    last: int
    reward_before: float
    reward_after: float
    share_before: float
    share_after: float

    def message(self) -> str:
        return (f"tool use falling while reward rises: over steps {self.first}-{self.last} the share of episodes "
                f"with at least one tool call fell {self.share_before:.2f} -> {self.share_after:.2f} while the batch "
                f"reward rose {self.reward_before:.3f} -> {self.reward_after:.3f}; the policy may be learning to "
                f"answer without its tools and still be rewarded. What to do: {WHAT_TO_DO}")


def tool_use_drop(steps: list[int], rewards: list[float], shares: list[float],
                  min_reward_rise: float = MIN_REWARD_RISE, min_share_drop: float = MIN_SHARE_DROP) -> ToolUseDrop | None:
    """The rule on one window (an even number of steps, oldest first): the drop, or None."""
    if len(steps) < 2 or len(steps) % 2 or not len(steps) == len(rewards) == len(shares):
        raise ValueError(f"tool_use_drop needs an even number >= 2 of steps, rewards and shares, got "
                         f"{len(steps)}, {len(rewards)}, {len(shares)}")
    h = len(steps) // 2
    drop = ToolUseDrop(steps[0], steps[-1], _mean(rewards[:h]), _mean(rewards[h:]), _mean(shares[:h]), _mean(shares[h:]))
    rose = drop.reward_after - drop.reward_before >= min_reward_rise
    fell = drop.share_before - drop.share_after >= min_share_drop
    return drop if rose and fell else None


@dataclass
class ToolUseWatch:
    """Follows the steps' reward and tool-call share; `observe` returns a warning when the rule holds."""

    window: int = WINDOW
    min_reward_rise: float = MIN_REWARD_RISE
    min_share_drop: float = MIN_SHARE_DROP
    warned_at: list[int] = field(default_factory=list)
    _recent: deque = field(default_factory=deque)  # (step, reward, share), the last `window` steps
    _quiet_until: int = -1

    def __post_init__(self) -> None:
        if self.window < 2 or self.window % 2:
            raise ValueError(f"ToolUseWatch's window must be an even number >= 2, got {self.window}")

    def observe(self, step: int, reward: float, share: float) -> str | None:
        """One step's mean reward and `call_episode_frac`; the warning's text, or None."""
        if not (math.isfinite(share) and math.isfinite(reward)):
            self._recent.clear()  # a window is made of steps in a row that all had tool calls to count
            return None
        self._recent.append((step, reward, share))
        while len(self._recent) > self.window:
            self._recent.popleft()
        if len(self._recent) < self.window or step <= self._quiet_until:
            return None
        steps, rewards, shares = (list(x) for x in zip(*self._recent))
        drop = tool_use_drop(steps, rewards, shares, self.min_reward_rise, self.min_share_drop)
        if drop is None:
            return None
        self.warned_at.append(step)
        self._quiet_until = step + self.window - 1
        return drop.message()

    def summary(self) -> dict[str, Any]:
        return {"warned_at_steps": list(self.warned_at)}
