"""The registry of tool-call formats: a format's parser, renderer and start marker, registered together.

A format is the text a model family writes for a tool call. Parsing it (rollout and the OpenAI
endpoint read calls out of a turn), rendering it (the endpoint writes back calls an agent re-sends,
as the model would have written them) and finding where a call starts (the endpoint cuts the reply's
`content` and holds back streamed text there) must agree, so they are one `ToolFormat`.

Pure: imports nothing of the project but agentrl.utils.registry, so the config's validator can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from agentrl.utils.registry import lookup


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


# `(turn_text) -> (calls, error)`: the calls read, in order, and an error string (not an exception)
# when the turn holds a malformed call, so the env can show the model an error observation.
ToolParser = Callable[[str], "tuple[list[ToolCall], str | None]"]
# `(calls) -> text`: the calls as the model would have written them (appended to the turn's content).
ToolRenderer = Callable[[list[ToolCall]], str]


@dataclass(frozen=True)
class ToolFormat:
    name: str
    parse: ToolParser
    render: ToolRenderer
    start_marker: str | None  # the text that opens a call; None: the format has no calls

    def cut(self, text: str) -> str:
        """`text` before its first call (all of it when there is none)."""
        at = text.find(self.start_marker) if self.start_marker else -1
        return text if at < 0 else text[:at]


TOOL_FORMATS: dict[str, ToolFormat] = {}


def register_tool_format(fmt: ToolFormat) -> ToolFormat:
    """Add `fmt` to `TOOL_FORMATS` under `fmt.name` (names are unique)."""
    if fmt.name in TOOL_FORMATS:
        raise ValueError(f"tool parser {fmt.name!r} is already registered")
    TOOL_FORMATS[fmt.name] = fmt
    return fmt


def register_tool_parser(name: str, *, render: ToolRenderer,
                         start_marker: str | None) -> Callable[[ToolParser], ToolParser]:
    """Decorator registering the parser it wraps as format `name`, with its renderer and start marker."""

    def deco(fn: ToolParser) -> ToolParser:
        register_tool_format(ToolFormat(name, fn, render, start_marker))
        return fn

    return deco


def get_tool_format(name: str) -> ToolFormat:
    """The format registered as `name`; `"pkg.module:name"` first imports the module that registers it."""
    return lookup(TOOL_FORMATS, name, "rollout.tool_format")


def get_tool_parser(name: str) -> ToolParser:
    """The parser of the format registered as `name` (see `get_tool_format`)."""
    return get_tool_format(name).parse


def _no_calls(text: str) -> tuple[list[ToolCall], str | None]:
    """Tools disabled: tag-like text in a turn is just text."""
    return [], None


def _render_nothing(calls: list[ToolCall]) -> str:
    return ""


NONE = register_tool_format(ToolFormat("none", _no_calls, _render_nothing, None))
