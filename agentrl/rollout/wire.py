"""What the OpenAI endpoint writes besides its bodies: errors in the shape of the API asked (OpenAI's,
or the Messages API's under /v1/messages), the API key check for both families of clients, and the
server-sent-event stream."""

from __future__ import annotations

import hmac
import json
from typing import Any

from aiohttp import web

from agentrl.rollout import messages_protocol as msgs
from agentrl.rollout import openai_protocol as proto
from agentrl.rollout.openai_protocol import ProtocolError

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def is_messages(request: web.Request) -> bool:
    """Anthropic's clients read errors in the Messages API's shape, OpenAI's in theirs."""
    return "/v1/messages" in request.path


def error_body(exc: ProtocolError, request: web.Request) -> dict[str, Any]:
    if is_messages(request):
        return msgs.error_body(str(exc), exc.status)
    return proto.error_body(str(exc), exc.kind, exc.param, exc.code)


def error_response(exc: ProtocolError, request: web.Request) -> web.Response:
    return web.json_response(error_body(exc, request), status=exc.status)


def authorized(request: web.Request, key: str) -> bool:
    """`Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's), compared in
    constant time."""
    want = key.encode()
    bearer = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    header = request.headers.get("x-api-key", "").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(bearer, b"Bearer " + want) | hmac.compare_digest(header, want)


class Sse:
    """A server-sent-event stream whose headers go out with the first event, so an error raised
    before anything was generated is still an ordinary JSON error with its status. A Messages API
    stream ends with its `message_stop` event, OpenAI's with `data: [DONE]`."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.messages = is_messages(request)

    async def send(self, obj: dict[str, Any]) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers=_SSE_HEADERS)
            await self.response.prepare(self.request)
        # Responses' and Messages' events name their type in an `event:` line too, as their servers do.
        event = f"event: {obj['type']}\n".encode() if isinstance(obj.get("type"), str) else b""
        await self.response.write(event + b"data: " + json.dumps(obj).encode() + b"\n\n")

    async def done(self) -> None:
        if not self.messages:
            await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()

    async def fail(self, exc: ProtocolError) -> web.StreamResponse:
        if self.response is None:
            return error_response(exc, self.request)
        await self.send(error_body(exc, self.request))
        await self.done()
        return self.response
