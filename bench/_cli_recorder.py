"""The recording server of bench/cli_requests.py: it answers a coding CLI's model requests in the API's own
shape with one short text reply (REPLY), streamed when asked, or forwards them to an agentrl endpoint, and
logs each request (method, path, headers without secrets, JSON body; with its answer when forwarded).

    POST .../responses              OpenAI Responses (SSE events when stream)
    POST .../chat/completions       chat completions (SSE chunks when stream)
    POST .../messages               Anthropic Messages (SSE events when stream)
    POST .../messages/count_tokens  {"input_tokens": body bytes / 4}
    GET  .../models                 one model, "recorder"
    anything else                   404, logged
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "proxy-authorization", "openai-api-key"}
REPLY = "Done."


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = []
    for name, data in events:
        out.append((f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def responses_reply(body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    rid, mid = f"resp_{uuid.uuid4().hex[:12]}", f"msg_{uuid.uuid4().hex[:12]}"
    item = {"type": "message", "id": mid, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": REPLY, "annotations": []}]}
    usage = {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12,
             "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    done = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": body.get("model", "recorder"), "output": [item], "usage": usage}
    start = {**done, "status": "in_progress", "output": [], "usage": None}
    part = {"type": "output_text", "text": "", "annotations": []}
    events = [("response.created", {"type": "response.created", "response": start}),
              ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                              "item": {**item, "status": "in_progress", "content": []}}),
              ("response.content_part.added", {"type": "response.content_part.added", "item_id": mid,
                                               "output_index": 0, "content_index": 0, "part": part}),
              ("response.output_text.delta", {"type": "response.output_text.delta", "item_id": mid,
                                              "output_index": 0, "content_index": 0, "delta": REPLY}),
              ("response.output_text.done", {"type": "response.output_text.done", "item_id": mid,
                                             "output_index": 0, "content_index": 0, "text": REPLY}),
              ("response.content_part.done", {"type": "response.content_part.done", "item_id": mid,
                                              "output_index": 0, "content_index": 0,
                                              "part": item["content"][0]}),
              ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
              ("response.completed", {"type": "response.completed", "response": done})]
    return done, _sse(events)


def chat_reply(body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    cid, now, model = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time()), body.get("model", "recorder")
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    done = {"id": cid, "object": "chat.completion", "created": now, "model": model, "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}]}
    chunk = {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model}
    events = [(None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
              (None, {**chunk, "choices": [{"index": 0, "delta": {"content": REPLY}}]}),
              (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})]
    return done, _sse(events) + b"data: [DONE]\n\n"


def messages_reply(body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    mid, model = f"msg_{uuid.uuid4().hex[:12]}", body.get("model", "recorder")
    usage = {"input_tokens": 10, "output_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    done = {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": REPLY}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": usage}
    events = [("message_start", {"type": "message_start", "message": {**done, "content": [], "stop_reason": None,
                                                                      "usage": {**usage, "output_tokens": 0}}}),
              ("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}),
              ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": REPLY}}),
              ("content_block_stop", {"type": "content_block_stop", "index": 0}),
              ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                 "usage": {"output_tokens": 2}}),
              ("message_stop", {"type": "message_stop"})]
    return done, _sse(events)


async def forward(request: web.Request, raw: bytes, upstream: str, record: dict[str, Any]) -> web.StreamResponse:
    """Passes the request on to `upstream` (e.g. agentrl.serve) and its answer back, streamed; the record
    gets the status and the answer's first 4,000 bytes (an error's message, or the first events)."""
    import aiohttp

    skip = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        async with http.request(request.method, upstream.rstrip("/") + request.rel_url.path_qs, headers=headers,
                                data=raw or None) as up:
            out = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in skip | {"content-encoding", "date", "server"}})
            await out.prepare(request)
            head = b""
            async for chunk in up.content.iter_any():
                if len(head) < 4000:
                    head += chunk[:4000 - len(head)]
                await out.write(chunk)
            await out.write_eof()
    record["status"], record["answer"] = up.status, head.decode("utf-8", "replace")
    return out


def recorder_app(log_path: Path, upstream: str | None = None) -> web.Application:
    log = log_path.open("a")

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = {"_unparsed": raw[:2000].decode("utf-8", "replace")}
        headers = {k: ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in request.headers.items()}
        path = request.path
        record = {"t": time.time(), "method": request.method, "path": path, "query": request.query_string,
                  "headers": headers, "body_bytes": len(raw), "body": body}
        if upstream is not None:
            try:
                return await forward(request, raw, upstream, record)
            finally:
                log.write(json.dumps(record) + "\n")
                log.flush()
        log.write(json.dumps(record) + "\n")
        log.flush()
        body = body if isinstance(body, dict) else {}
        if request.method == "GET" and path.rstrip("/").endswith("/models"):
            return web.json_response({"object": "list", "data": [
                {"id": "recorder", "object": "model", "created": 0, "owned_by": "agentrl",
                 "type": "model", "display_name": "recorder", "created_at": "2026-01-01T00:00:00Z"}],
                "has_more": False, "first_id": "recorder", "last_id": "recorder"})
        if request.method != "POST":
            return web.json_response({"error": {"message": f"not recorded here: {request.method} {path}"}}, status=404)
        if path.endswith("/messages/count_tokens"):
            return web.json_response({"input_tokens": max(1, len(raw) // 4)})
        for suffix, reply in (("/responses", responses_reply), ("/chat/completions", chat_reply),
                              ("/messages", messages_reply)):
            if path.endswith(suffix):
                done, stream = reply(body)
                if not body.get("stream"):
                    return web.json_response(done)
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await response.prepare(request)
                await response.write(stream)
                await response.write_eof()
                return response
        return web.json_response({"error": {"message": f"not recorded here: POST {path}"}}, status=404)

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def start_recorder(log_path: Path, port: int = 0, upstream: str | None = None) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(recorder_app(log_path, upstream), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner, runner.addresses[0][1]
