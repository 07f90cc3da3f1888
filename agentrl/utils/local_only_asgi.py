"""`LocalOnlyASGI`: agentrl.utils.local_only's rules around an ASGI app (a FastAPI / Starlette app run by
uvicorn, e.g. an OpenEnv server: envs.openenv_server). The same `Guard` decides; this file only reads an
ASGI scope and writes the refusal: a JSON body {"error": reason} with its status for HTTP, and for a
WebSocket handshake the same status where the server can send one (uvicorn's `websocket.http.response`
extension), else a close before accepting, which uvicorn answers with 403. Lifespan events pass through."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Iterable

from agentrl.utils.local_only import Guard

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class LocalOnlyASGI:
    """Wraps `app`; a request the guard refuses never reaches it."""

    def __init__(self, app: Any, bind_host: str, allow_hosts: Iterable[str] = (), token: str | None = None) -> None:
        self.app = app
        self.guard = Guard.for_bind(bind_host, allow_hosts, token)
        self.refused = 0  # requests and handshakes turned away (tests read it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers: dict[str, str] = {}
        for key, value in scope.get("headers", []):
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))  # the first, as aiohttp's get
        websocket = scope["type"] == "websocket"
        length = headers.get("content-length", "0").strip()
        has_body = "transfer-encoding" in headers or length not in ("", "0")
        refused = self.guard.refusal(None if websocket else scope["method"], lambda name: headers.get(name.lower()),
                                     has_body)
        if refused is None:
            return await self.app(scope, receive, send)
        self.refused += 1
        status, reason = refused
        body = json.dumps({"error": reason}).encode()
        start = {"status": status, "headers": [(b"content-type", b"application/json"),
                                               (b"content-length", str(len(body)).encode())]}
        if not websocket:
            await send({"type": "http.response.start", **start})
            await send({"type": "http.response.body", "body": body})
            return None
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", **start})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})
        return None
