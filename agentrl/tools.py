"""Reading tool calls out of a model turn, one registry of parsers, and tool-call counters.

A parser has one signature, `(turn_text) -> (calls, error)`: it returns the calls it could read, in
order, and an error string (not an exception) when the turn holds a malformed call, so the env can
show the model an error observation instead of the episode crashing.

    TOOL_PARSERS["hermes"]   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number per turn
                             (the Hermes / Qwen2.5 / Qwen3 chat format, and the embedded default's)
    TOOL_PARSERS["none"]     tools disabled: the turn is plain text

`rollout.tool_parser` in the config picks one by name. Another model family adds its format with

    @register_tool_parser("mistral")
    def parse_mistral(text: str) -> tuple[list[ToolCall], str | None]: ...

and, because the config is validated before user modules are imported, names it in the config as
`"my_pkg.parsers:mistral"` (import `my_pkg.parsers`, which registers "mistral").
"""

from __future__ import annotations

import importlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

ToolParser = Callable[[str], "tuple[list[ToolCall], str | None]"]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


TOOL_PARSERS: dict[str, ToolParser] = {}


def register_tool_parser(name: str) -> Callable[[ToolParser], ToolParser]:
    """Decorator adding a parser to `TOOL_PARSERS` under `name` (names are unique)."""

    def deco(fn: ToolParser) -> ToolParser:
        if name in TOOL_PARSERS:
            raise ValueError(f"tool parser {name!r} is already registered")
        TOOL_PARSERS[name] = fn
        return fn

    return deco


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as `name`; `"pkg.module:name"` first imports the module that registers it."""
    if ":" in name:
        module, _, name = name.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"cannot import tool parser module {module!r}: {exc}") from exc
    parser = TOOL_PARSERS.get(name)
    if parser is None:
        raise ValueError(f"tool parser {name!r} is not one of {sorted(TOOL_PARSERS)}")
    return parser


_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register_tool_parser("hermes")
def parse_tool_calls(text: str) -> tuple[list[ToolCall], str | None]:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, parallel calls in order.

    `arguments` may be an object or (OpenAI style) a JSON string holding one. Calls before a
    malformed one are kept; an opening tag with no closing one (a turn cut at max_tokens) is an error.
    """
    calls: list[ToolCall] = []
    for raw in _HERMES_RE.findall(text):
        try:
            obj = json.loads(raw)
            args = obj.get("arguments") or {}
            if isinstance(args, str):  # OpenAI style: arguments as a JSON string
                args = json.loads(args)
            calls.append(ToolCall(name=str(obj["name"]), arguments=dict(args)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            return calls, f"malformed tool call {raw.strip()[:80]!r}: {exc}"
    if text.count("<tool_call>") > text.count("</tool_call>"):
        return calls, "unterminated <tool_call> (no closing </tool_call>; was the turn cut at max_tokens?)"
    return calls, None


@register_tool_parser("none")
def parse_no_tools(text: str) -> tuple[list[ToolCall], str | None]:
    """Tools disabled: tag-like text in a turn is just text."""
    return [], None


# ---------------------------------------------------------------- counters

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
