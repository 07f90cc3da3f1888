"""Tools: reading tool calls out of a model turn (one registry of parsers), tool-call counters, and
the client of tools served over HTTP.

## Parsers

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

## Remote tools

Wire protocol (the reference server is `rewards.servers.tools`), relative to a base URL:

    GET  <url>/tools   -> 200 {"tools": [{"type": "function",
                                          "function": {"name": str, "description": str, "parameters": {...}}}]}
    POST <url>/call    headers: Idempotency-Key: <call key>, Authorization: Bearer <token> (optional)
                       request:  {"name": str, "arguments": {...}}
                       response: 200 {"content": str, "is_error": bool (optional), "info": {...} (optional)}

`is_error: true` is a tool that ran and refused its arguments (e.g. division by zero): the content is
meant for the model. Anything else that goes wrong is an infrastructure failure with the retry policy
of `agentrl.http_common` (retried: connect errors, timeouts, dropped connections, 5xx, 429 with
Retry-After; not retried: other 4xx, bad JSON, a reply that breaks the schema or exceeds
`max_response_bytes`) and comes back as `ToolResult(status="error" | "timeout")`, never as content.

The call key is sent unchanged on every retry of one call, so a tool with side effects can deduplicate.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import re
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from agentrl.config import EndpointConfig
from agentrl.http_common import Failure, PooledEndpoint, parse_json_model

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


# -- remote tools ------------------------------------------------------------------------------------

ToolStatus = Literal["ok", "error", "timeout"]


class ToolServerConfig(EndpointConfig):
    """One tool server and how hard to try it."""

    url: str = Field(description="Base URL of the tool server; <url>/tools and <url>/call are requested.")


@dataclass(frozen=True)
class ToolResult:
    status: ToolStatus  # "ok": the server answered (see info["is_error"]); else an infrastructure failure
    content: str = ""  # what the model is shown; "" when status is not "ok"
    info: dict[str, Any] = field(default_factory=dict)  # ok: attempts, is_error, server info; else error/kind/...

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: StrictStr = Field(min_length=1)
    description: StrictStr = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class _Spec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: _Function


class _ToolsReply(BaseModel):
    tools: list[_Spec]


class _CallReply(BaseModel):
    content: StrictStr
    is_error: bool = Field(False, strict=True)
    info: dict[str, Any] | None = None


class RemoteToolError(RuntimeError):
    """A tool server could not be used (discovery failed, or a call failed for infrastructure reasons)."""


class RemoteToolClient(PooledEndpoint):
    """One tool server behind one pooled httpx.AsyncClient.

    `RemoteToolClient("http://127.0.0.1:8765", read_timeout_s=5)` or `RemoteToolClient(ToolServerConfig(...))`.
    Reuse one instance per server and event loop (`shared_client` does that) and `await aclose()` at the end.
    """

    label = "tool server"
    config: ToolServerConfig

    def __init__(self, url: str | ToolServerConfig, *, transport: httpx.AsyncBaseTransport | None = None,
                 **config: Any) -> None:
        cfg = url if isinstance(url, ToolServerConfig) else ToolServerConfig(url=url.rstrip("/"), **config)
        super().__init__(cfg, transport=transport)
        self._tools: list[dict[str, Any]] | None = None
        self._tools_lock = asyncio.Lock()

    async def tools(self) -> list[dict[str, Any]]:
        """`list_tools()` once per client: concurrent first callers share one request; failures are not cached."""
        if self._tools is None:
            async with self._tools_lock:
                if self._tools is None:
                    self._tools = await self.list_tools()
        return list(self._tools)

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's OpenAI function specs (validated; a missing description/parameters is filled in).

        Raises RemoteToolError when the server cannot be reached or answers out of protocol."""
        outcome, attempts = await self.request("GET", self.config.url + "/tools", _parse_tools)
        if isinstance(outcome, Failure):
            raise RemoteToolError(f"tool discovery at {self.config.url}/tools failed ({outcome.status}, "
                                  f"{attempts} attempt(s)): {outcome.message}")
        names = [spec["function"]["name"] for spec in outcome]
        if len(set(names)) != len(names):
            raise RemoteToolError(f"tool server {self.config.url} lists duplicate tool names: {names}")
        return outcome

    async def call(self, name: str, arguments: dict[str, Any], key: str | None = None) -> ToolResult:
        """Run tool `name`; `key` (default: a fresh uuid) is the Idempotency-Key of every retry."""
        key = key or uuid.uuid4().hex
        try:
            body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            self._stats.calls += 1
            failure = Failure("encode", f"tool arguments are not JSON-serialisable: {exc}", False)
            self.record_failure(failure, 0)
            return ToolResult(failure.status, "", failure.info(0, self.config.url))
        outcome, attempts = await self.request("POST", self.config.url + "/call", _parse_call, body=body,
                                               headers={"Idempotency-Key": key})
        if isinstance(outcome, Failure):
            return ToolResult(outcome.status, "", {**outcome.info(attempts, self.config.url + "/call"), "tool": name})
        info = {"attempts": attempts, "is_error": outcome.is_error, "server": outcome.info or {}}
        return ToolResult("ok", outcome.content, info)


def _parse_tools(body: bytes) -> list[dict[str, Any]] | Failure:
    shape = '{tools: [{type: "function", function: {name: str, description: str, parameters: object}}]}'
    parsed = parse_json_model(body, _ToolsReply, shape)
    if isinstance(parsed, Failure):
        return parsed
    return [spec.model_dump() for spec in parsed.tools]


def _parse_call(body: bytes) -> _CallReply | Failure:
    return parse_json_model(body, _CallReply, "{content: str, is_error: bool, info: object}")


# One client per (event loop, URL): an httpx.AsyncClient is bound to the loop it first ran on, and
# sharing it across the episodes of a run is what makes the pool and the concurrency cap mean anything.
_SHARED: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, RemoteToolClient]]" = \
    weakref.WeakKeyDictionary()


def shared_client(url: str, **config: Any) -> RemoteToolClient:
    """The RemoteToolClient for `url` on the running event loop (created with `config` on first use)."""
    clients = _SHARED.setdefault(asyncio.get_running_loop(), {})
    key = url.rstrip("/")
    if key not in clients:
        clients[key] = RemoteToolClient(key, **config)
    return clients[key]


async def aclose_shared() -> None:
    """Close the running loop's shared clients (at the end of a run or a test)."""
    clients = _SHARED.pop(asyncio.get_running_loop(), {})
    for client in clients.values():
        await client.aclose()


def truncate_to_tokens(text: str, tokenizer: Any, budget: int, marker: str = " …[truncated]") -> str:
    """`text` cut so that it encodes to at most `budget` tokens, ending with `marker` when cut.

    The tokenizer is a Hugging Face tokenizer (anything with encode/decode). `None` bounds UTF-8 bytes
    instead: a byte-level BPE never spends more than one token per byte, so the budget still holds.
    """
    if budget <= 0:
        return ""
    encode = _encoder(tokenizer)
    ids = encode(text)
    if len(ids) <= budget:
        return text
    tail = marker if len(encode(marker)) < budget else ""
    keep = budget - len(encode(tail))
    # Re-encoding a decoded prefix plus the marker can merge differently across the seam, so shrink
    # until the whole result fits (a few steps at most).
    while keep > 0:
        head = _decode(tokenizer, ids[:keep]).rstrip("\ufffd")  # no half of a split character
        out = head.rstrip() + tail if tail else head
        if len(encode(out)) <= budget:
            return out
        keep -= 1
    return tail if len(encode(tail)) <= budget else ""


def _encoder(tokenizer: Any):
    if tokenizer is None:
        return lambda s: list(s.encode("utf-8"))
    return lambda s: list(tokenizer.encode(s, add_special_tokens=False))


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if tokenizer is None:
        return bytes(ids).decode("utf-8", "replace")
    return tokenizer.decode(ids)
