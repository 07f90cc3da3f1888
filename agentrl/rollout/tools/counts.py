"""Tool-call counters: one model turn's parse outcome into an episode's `info` (`record_tool_turn`),
and those counters summed over episodes into the `tools/*` metrics (`ToolCallStats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agentrl.rollout.tools import ToolCall

_EPISODE_KEYS = ("tool_calls", "tool_parse_errors", "tool_call_turns")


def record_tool_turn(info: dict[str, Any], calls: list[ToolCall], error: str | None) -> None:
    """Add one model turn's parse outcome to an episode's `info` counters.

    tool_calls: calls parsed; tool_parse_errors: turns whose parser reported an error;
    tool_call_turns: turns that attempted a call (parsed one or failed to), the parse-failure denominator.
    """
    for key in _EPISODE_KEYS:
        info.setdefault(key, 0)
    info["tool_calls"] += len(calls)
    info["tool_parse_errors"] += error is not None
    info["tool_call_turns"] += bool(calls) or error is not None


@dataclass
class ToolCallStats:
    """Tool use summed over episodes that had at least one model turn (whatever their status)."""

    episodes: int = 0
    turns: int = 0  # model turns
    tool_calls: int = 0  # calls parsed
    tool_call_turns: int = 0  # turns that attempted a call
    tool_parse_errors: int = 0  # turns whose attempted call could not be parsed
    episodes_without_tool_call: int = 0  # episodes in which no call was parsed
    episodes_reporting_success: int = 0  # episodes whose env reported info["tool_success"]
    episodes_with_tool_success: int = 0  # ... as true: a call the tool server executed without error

    def add_episode(self, episode: Any) -> None:
        """Count an `agentrl.types.Episode` (its `turns`, the `info` keys of `record_tool_turn`, and
        `info["env"]["tool_success"]` where the env reports it)."""
        if not episode.turns:
            return
        calls = int(episode.info.get("tool_calls", 0))
        env_info = episode.info.get("env", {})
        if "tool_success" in env_info:
            self.episodes_reporting_success += 1
            self.episodes_with_tool_success += bool(env_info["tool_success"])
        self.episodes += 1
        self.turns += len(episode.turns)
        self.tool_calls += calls
        self.tool_call_turns += int(episode.info.get("tool_call_turns", 0))
        self.tool_parse_errors += int(episode.info.get("tool_parse_errors", 0))
        self.episodes_without_tool_call += calls == 0

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def metrics(self) -> dict[str, float]:
        """Counts plus the rates; a rate with nothing to divide by is NaN (null in metrics.jsonl)."""

        def ratio(a: int, b: int) -> float:
            return a / b if b else math.nan

        return {
            "tools/calls": self.tool_calls, "tools/turns": self.turns, "tools/parse_errors": self.tool_parse_errors,
            "tools/episodes_without_call": self.episodes_without_tool_call,
            "tools/calls_per_turn": ratio(self.tool_calls, self.turns),
            "tools/parse_failure_rate": ratio(self.tool_parse_errors, self.tool_call_turns),
            "tools/no_call_episode_frac": ratio(self.episodes_without_tool_call, self.episodes),
            "tools/call_success_rate": ratio(self.episodes_with_tool_success, self.episodes_reporting_success),
        }
