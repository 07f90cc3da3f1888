"""Mistral's tool-call format (Mistral 7B Instruct v0.3, Mixtral 8x22B Instruct, Mistral Nemo):
`[TOOL_CALLS]` followed by a JSON list of calls, `[{"name": ..., "arguments": {...}}, ...]`."""

from __future__ import annotations

import json

from agentrl.rollout.tools.registry import ToolCall, ToolFormat, register_tool_format

START = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()


def _call(obj: object) -> ToolCall:
    if not isinstance(obj, dict):
        raise TypeError(f"a call is a JSON object, not {type(obj).__name__}")
    args = obj.get("arguments") or {}
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        args = json.loads(args)
    if not isinstance(args, dict):
        raise TypeError(f"arguments must be a JSON object, not {type(args).__name__}")
    return ToolCall(name=str(obj["name"]), arguments=args)


def parse(text: str) -> tuple[list[ToolCall], str | None]:
    """Every `[TOOL_CALLS][...]` list in the turn, calls in order; text after a list is ignored (the
    model's EOS text, say). Calls before a malformed one are kept; a list cut short is an error."""
    calls: list[ToolCall] = []
    for chunk in text.split(START)[1:]:
        body = chunk.lstrip()
        try:
            items, _ = _DECODER.raw_decode(body)
        except json.JSONDecodeError as exc:
            return calls, (f"malformed tool call {body[:80]!r}: {exc} (was the turn cut at max_tokens?)")
        if not isinstance(items, list):
            return calls, f"malformed tool call {body[:80]!r}: [TOOL_CALLS] must be followed by a JSON list"
        for obj in items:
            try:
                calls.append(_call(obj))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                return calls, f"malformed tool call {json.dumps(obj)[:80]!r}: {exc}"
    return calls, None


def render(calls: list[ToolCall]) -> str:
    if not calls:
        return ""
    return START + json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls])


MISTRAL = register_tool_format(ToolFormat("mistral", parse, render, START))
