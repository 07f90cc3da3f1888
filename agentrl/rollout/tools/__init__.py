"""Tool-call formats: how a model family writes a tool call, one registry (`TOOL_FORMATS`) of formats
each registering its parser, renderer and start marker together. Pure: imports nothing of the project
above it, so `agentrl.config` validates `rollout.tool_format` against it.

    TOOL_FORMATS["hermes"]   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number per turn
                             (the Hermes / Qwen2.5 / Qwen3 chat format, and the embedded default's)
    TOOL_FORMATS["mistral"]  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]  (Mistral v0.3 / Nemo)
    TOOL_FORMATS["none"]     tools disabled: the turn is plain text

A parser has one signature, `(turn_text) -> (calls, error)`: it returns the calls it could read, in
order, and an error string (not an exception) when the turn holds a malformed call. A renderer is
`(calls) -> text`, the calls as the model would have written them; the start marker is the text that
opens a call (where the OpenAI endpoint cuts a reply's `content`).

`rollout.tool_format` in the config picks one by name (rollout and the OpenAI endpoint both use it).
Another model family adds its format with

    @register_tool_parser("llama3", render=render_llama3, start_marker="<|python_tag|>")
    def parse_llama3(text: str) -> tuple[list[ToolCall], str | None]: ...

(or `register_tool_format(ToolFormat(name, parse, render, start_marker))`) and, because the config
is validated before user modules are imported, names it in the config as `"my_pkg.parsers:llama3"`
(import `my_pkg.parsers`, which registers "llama3").
"""

from agentrl.rollout.tools import hermes, mistral  # noqa: F401  (registering the built-in formats)
from agentrl.rollout.tools.registry import (TOOL_FORMATS, ToolCall, ToolFormat, ToolParser, ToolRenderer,
                                           get_tool_format, get_tool_parser, register_tool_format,
                                           register_tool_parser)

__all__ = ["TOOL_FORMATS", "ToolCall", "ToolFormat", "ToolParser", "ToolRenderer", "get_tool_format",
           "get_tool_parser", "register_tool_format", "register_tool_parser"]
