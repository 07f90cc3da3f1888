"""The Hermes tool-call format (Hermes, Qwen2.5, Qwen3 and the embedded default model):
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn."""

from __future__ import annotations

import json
import re

from agentrl.rollout.tools.registry import ToolCall, ToolFormat, register_tool_format

START = "<tool_call>"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse(text: str) -> tuple[list[ToolCall], str | None]:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, parallel calls in order.

    `arguments` may be an object or (OpenAI style) a JSON string holding one. Calls before a
    malformed one are kept; an opening tag with no closing one (a turn cut at max_tokens) is an error.
    """
    calls: list[ToolCall] = []
    for raw in _CALL_RE.findall(text):
        try:
            obj = json.loads(raw)
            args = obj.get("arguments") or {}
            if isinstance(args, str):  # OpenAI style: arguments as a JSON string
                args = json.loads(args)
            calls.append(ToolCall(name=str(obj["name"]), arguments=dict(args)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            return calls, f"malformed tool call {raw.strip()[:80]!r}: {exc}"
    if text.count(START) > text.count("</tool_call>"):
        return calls, "unterminated <tool_call> (no closing </tool_call>; was the turn cut at max_tokens?)"
    return calls, None


def render(calls: list[ToolCall]) -> str:
    return "".join(f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>"
                   for c in calls)


HERMES = register_tool_format(ToolFormat("hermes", parse, render, START))
