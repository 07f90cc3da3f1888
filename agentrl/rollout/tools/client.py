"""The client of tools served over HTTP: `RemoteToolClient`, one per server and event loop (`shared_client`).

Wire protocol (the reference server is `rewards.servers.tools`), relative to a base URL:

    GET  <url>/tools   -> 200 {"tools": [{"type": "function",
                                          "function": {"name": str, "description": str, "parameters": {...}}}]}
    POST <url>/call    headers: Idempotency-Key: <call key>, Authorization: Bearer <token> (optional)
                       request:  {"name": str, "arguments": {...}}
                       response: 200 {"content": str, "is_error": bool (optional), "info": {...} (optional)}

`is_error: true` is a tool that ran and refused its arguments (e.g. division by zero): the content is
meant for the model. Anything else that goes wrong is an infrastructure failure with the retry policy
of `agentrl.utils.http_common` (retried: connect errors, timeouts, dropped connections, 5xx, 429 with
Retry-After; not retried: other 4xx, bad JSON, a reply that breaks the schema or exceeds
`max_response_bytes`) and comes back as `ToolResult(status="error" | "timeout")`, never as content.

The call key is sent unchanged on every retry of one call, so a tool with side effects can deduplicate.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from agentrl.config import ToolServerConfig
from agentrl.utils.http_common import Failure, PooledEndpoint, parse_json_model

ToolStatus = Literal["ok", "error", "timeout"]


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


_NAMED: dict[str, ToolServerConfig] = {}  # tools.servers of the config this process runs


def register_tool_servers(servers: dict[str, ToolServerConfig]) -> None:
    """Make the config's `tools.servers` the ones `named_client` knows (start-up does this)."""
    _NAMED.clear()
    _NAMED.update(servers)


def named_client(name: str) -> RemoteToolClient:
    """The shared client of the tool server `tools.servers.<name>`, built with its settings."""
    if name not in _NAMED:
        raise RemoteToolError(f"no tool server named {name!r} (tools.servers: {sorted(_NAMED) or 'none'})")
    server = _NAMED[name]
    return shared_client(server.url, **server.model_dump(exclude={"url"}))


async def aclose_shared() -> None:
    """Close the running loop's shared clients (at the end of a run or a test)."""
    clients = _SHARED.pop(asyncio.get_running_loop(), {})
    for client in clients.values():
        await client.aclose()
