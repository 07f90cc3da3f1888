"""An OpenAI-compatible endpoint on the rollout engines (aiohttp), one token ledger per session.

    GET  /v1/models                           the served model
    POST /v1/chat/completions                 streaming or not; tool calls in OpenAI's `tool_calls` shape
    POST /v1/completions                      plain text (or token-id) prompts
    POST /v1/responses                        the Responses API on the same ledger (responses_protocol)
    POST /v1/messages                         Anthropic's Messages API on the same ledger (messages_protocol)
    POST /v1/messages/count_tokens            the prompt's tokens as the model would see it
    POST /sessions                            open a session: {"id", "base_url"} (agentrl.serve)
    GET  /sessions/<id>                       its ledger: tokens, loss mask, logprobs, versions, segments
    DELETE /sessions/<id>
    .../sessions/<id>/v1/...                  the /v1 routes inside that session

Training opens one session per AgentEnv episode (`open_session`) and hands the agent
`<url>/sessions/<id>/v1` as its base URL; the session is the episode's ledger
(agentrl.rollout.session). Requests of one session are served one at a time, in arrival order.
Requests outside a session are served on a throwaway ledger; only they may ask for `n` > 1 choices,
each its own sample (with a seed s, choice i samples with seed s + i).

Binds 127.0.0.1 unless told otherwise; with `api_key` set, a request without
`Authorization: Bearer <api_key>` (or, as Anthropic's clients send it, `x-api-key: <api_key>`) is a 401. Local programs only (agentrl.utils.local_only): a foreign Host
(beyond `server.allow_hosts`) or Origin is a 403, a POST that is not application/json a 415. Errors are in OpenAI's shape (the Messages API's own shape under /v1/messages); an unknown session is a 404.

Bounded for a shared machine: a session opened over HTTP is closed after `server.session_idle_timeout_s`
without a request (a sweep), holds at most `server.session_max_turns` turns and `server.session_max_tokens`
tokens (more is a 400), `server.max_sessions` are open at once (more is a 429), a generation past its
deadline (`server.generation_timeout_s` where the rollout sets none) is a 504, and a client that leaves
cancels its request's handler (`handler_cancellation`), which cancels the engine's generation (the
Engine's stream aborts the vLLM request when closed). A client's mistake is a 4xx naming it; a 5xx
body names an error id that the log holds with the traceback, never the exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any, Callable

from aiohttp import web

from agentrl.data.chat import ChatFormat
from agentrl.config import ServerConfig
from agentrl.utils.http_common import BadRequestBody, loads_request
from agentrl.utils.local_only import local_only, warn_if_exposed
from agentrl.rollout import messages_protocol as msgs
from agentrl.rollout import openai_protocol as proto
from agentrl.rollout import responses_protocol as resp
from agentrl.rollout.openai_protocol import ProtocolError
from agentrl.rollout import serve_bounds as bounds
from agentrl.rollout.wire import Sse, authorized, error_response
from agentrl.rollout.session import ClientGone, Limits, Reply, Session
from agentrl.rollout.tools import ToolFormat
from agentrl.types import Episode

log = logging.getLogger(__name__)


class OpenAIServer:
    """Start with `await server.start()`, end with `await server.stop()`. `engine`: the GenerateFn
    that serves requests made outside a session and sessions opened over HTTP (an Engine or a fleet).
    `tool_format`: the model's tool-call format (`rollout.tool_format`), which every session parses,
    renders and cuts tool calls with."""

    def __init__(self, fmt: ChatFormat, cfg: ServerConfig, tool_format: ToolFormat, limits: Limits,
                 engine: Any = None) -> None:
        self.fmt, self.cfg, self.tool_format, self.limits, self.engine = fmt, cfg, tool_format, limits, engine
        self.sessions: dict[str, Session] = {}
        self.counters: Counter[str] = Counter(segments_split=0, sampling_overridden=0, max_tokens_capped=0)
        self.limits = bounds.with_deadline(limits, cfg)  # agentrl.serve's limits set no deadline: the server's
        self._runner: web.AppRunner | None = None
        self._sweeper: asyncio.Task | None = None
        self._client: Any = None  # the openai.AsyncOpenAI AgentEnv episodes share (`client`)
        self._key = cfg.api_key.get_secret_value() if cfg.api_key else None  # requests must carry it; agents' clients do
        self._anthropic: Any = None  # the anthropic.AsyncAnthropic they share (`anthropic_client`)
        self.port = cfg.port
        self.app = self._app()

    # -- lifecycle ---------------------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[local_only(self.cfg.host, self.cfg.allow_hosts), self._auth],
                              client_max_size=64 * 2**20)
        for prefix in ("", "/sessions/{sid}"):
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
            app.router.add_post(prefix + "/v1/responses", self._responses)
            app.router.add_post(prefix + "/v1/messages", self._messages)
            app.router.add_post(prefix + "/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/sessions", self._open)
        app.router.add_get("/sessions/{sid}", self._ledger)
        app.router.add_delete("/sessions/{sid}", self._close)
        return app

    async def start(self) -> None:
        warn_if_exposed(log, self.cfg.host, "OpenAI endpoint", "anyone who can reach this port can generate with "
                        "your model", self.cfg.api_key is not None)
        # handler_cancellation: a client that disconnects cancels its handler, and so its generation.
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._sweeper = asyncio.create_task(self._sweep_forever())
        log.info("OpenAI endpoint on %s (model %r)", self.url, self.cfg.model_name)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for client in (self._client, self._anthropic):
            if client is not None:
                await client.close()
        self._client = self._anthropic = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "") else self.cfg.host
        return f"http://{host}:{self.port}"

    def client(self, base_url: str, timeout_s: float) -> Any:
        """An `openai.AsyncOpenAI` on `base_url` (a session's) sharing one connection pool per server,
        closed by `stop()`. No retries: a failed request has already ended the ledger where it failed."""
        import openai

        if self._client is None:
            self._client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self._key or "agentrl", max_retries=0)
        return self._client.with_options(base_url=base_url, timeout=timeout_s)

    def anthropic_client(self, base_url: str, timeout_s: float) -> Any:
        """An `anthropic.AsyncAnthropic` on the session whose OpenAI base URL is `base_url` (the Anthropic
        SDK appends `/v1/messages` itself), one connection pool per server, as `client`."""
        import anthropic

        if self._anthropic is None:
            self._anthropic = anthropic.AsyncAnthropic(base_url=self.url, api_key=self._key or "agentrl", max_retries=0)
        return self._anthropic.with_options(base_url=base_url.removesuffix("/v1"), timeout=timeout_s)

    # -- sessions ------------------------------------------------------------------------------------

    def open_session(self, engine: Any, episode: Episode, limits: Limits | None = None) -> Session:
        """A session whose ledger is `episode`, generating on `engine`; its base URL is `session.base_url`.
        Training episodes' sessions are bounded by `rollout.max_concurrency`, not by the HTTP cap (`_open`)."""
        sid = uuid.uuid4().hex
        session = Session(sid, self.fmt, engine, episode, limits or self.limits, self.tool_format,
                          self.counters)
        session.base_url = f"{self.url}/sessions/{sid}/v1"
        self.sessions[sid] = session
        self.counters["sessions"] += 1
        return session

    def close_session(self, sid: str) -> Session | None:
        return self.sessions.pop(sid, None)

    def sweep(self, now: float | None = None) -> int:
        """Close the HTTP-opened sessions idle for `server.session_idle_timeout_s` (serve_bounds.sweep)."""
        return bounds.sweep(self.sessions, self.cfg, self.counters, now)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(bounds.sweep_period_s(self.cfg))
            self.sweep()

    def stats(self) -> dict[str, float]:
        """Counters since start: `ledger/segments_split`, `ledger/sampling_overridden`,
        `ledger/max_tokens_capped` (requests asking for more than the per-turn cap), requests, sessions."""
        return {f"ledger/{k}": float(v) for k, v in sorted(self.counters.items())}

    # -- middleware and small routes -------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        key = self._key
        if key is not None and not authorized(request, key):
            self.counters["unauthorized"] += 1
            why = "missing or wrong API key (Authorization: Bearer <api key>, or x-api-key: <api key>)"
            return error_response(ProtocolError(why, None, 401, "invalid_api_key"), request)
        try:
            return await handler(request)
        except ProtocolError as exc:
            return error_response(bounds.public(exc, f"{request.method} {request.path}"), request)
        except (web.HTTPException, ConnectionError):  # aiohttp's 404/405/413; a client gone (an episode cancelled)
            raise
        except ClientGone:  # nobody is left to answer
            raise ConnectionResetError("the client disconnected") from None
        except Exception as exc:  # a bug here must still answer in OpenAI's shape: an id, the traceback logged
            return error_response(bounds.internal(f"OpenAI endpoint: {request.method} {request.path}", exc), request)

    async def _models(self, request: web.Request) -> web.Response:
        self._find(request)
        return web.json_response(proto.models_response(self.cfg.model_name))

    def _find(self, request: web.Request) -> Session | None:
        sid = request.match_info.get("sid")
        if sid is None:
            return None
        session = self.sessions.get(sid)
        if session is None:
            raise bounds.unknown_session(sid, self.cfg)
        session.last_used = time.monotonic()
        return session

    async def _open(self, request: web.Request) -> web.Response:
        if self.engine is None:
            raise ProtocolError("this server opens sessions only for its own episodes", None, 403)
        opened = sum(s.expires for s in self.sessions.values())  # those a client opened over HTTP
        if opened >= self.cfg.max_sessions:
            raise bounds.too_many_sessions(opened, self.cfg)
        session = self.open_session(self.engine, Episode(task_id="http", group_id=-1),
                                    bounds.http_limits(self.limits, self.cfg))
        session.expires = True
        return web.json_response({"id": session.sid, "base_url": session.base_url})

    async def _ledger(self, request: web.Request) -> web.Response:
        ep = self._find(request).ep
        current = {"tokens": ep.tokens, "loss_mask": ep.loss_mask, "logprobs": ep.logprobs,
                   "versions": ep.versions, "prompt_len": ep.prompt_len}
        segments = [{"tokens": s.tokens, "loss_mask": s.loss_mask, "logprobs": s.logprobs, "versions": s.versions,
                     "prompt_len": s.prompt_len, "reason": s.reason} for s in ep.segments]
        return web.json_response({**current, "segments": segments, "messages": ep.messages,
                                  "text": self.fmt.tokenizer.decode(ep.tokens)})

    async def _close(self, request: web.Request) -> web.Response:
        session = self._find(request)
        self.close_session(session.sid)
        return web.json_response({"id": session.sid, "deleted": True})

    # -- completions ---------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        try:
            return loads_request(await request.read())
        except BadRequestBody as exc:
            raise ProtocolError(str(exc)) from None

    def _session_for(self, request: web.Request | None) -> Session:
        session = None if request is None else self._find(request)
        if session is not None:
            return session
        if self.engine is None:
            raise ProtocolError("requests outside a session are not served here; use the session's base URL",
                                None, 404, "session_not_found")
        return Session("", self.fmt, self.engine, Episode(task_id="", group_id=-1), self.limits, self.tool_format,
                       self.counters)

    async def _samples(self, req: Any, mode: str) -> list[Reply]:
        """`n` samples of an out-of-session request, each on its own throwaway ledger."""
        s, top = req.sampling, (1 << 63) - 1

        async def one(i: int) -> Reply:
            session = self._session_for(None)
            seed = None if s.seed is None else s.seed + i if s.seed + i <= top else s.seed - i
            plan = session.plan_chat(req) if mode == "chat" else session.plan_text(req)
            return await session.complete(plan, mode, replace(s, seed=seed))

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(i)) for i in range(s.n)]
        return [t.result() for t in tasks]

    async def _serve(self, request: web.Request, req: Any, mode: str, whole: Callable[[list[Reply]], dict],
                     pieces: Callable[[str, bool], list[dict]], finish: Callable[[Reply, str], list[dict]],
                     on_plan: Callable[[Any], None] | None = None):
        """One completion on the request's session: a JSON body (`whole` of its choices), or an event
        stream of `pieces(text, first)` as text arrives, then `finish(reply, text streamed so far)`.
        `on_plan(plan)` sees the planned prompt before anything is generated or streamed."""
        n, inside = req.sampling.n, request.match_info.get("sid") is not None
        if n > 1 and (inside or req.stream):
            raise ProtocolError("'n' must be 1 " + ("inside a session: its ledger holds one sample per request; "
                                                    "ask outside a session (<server>/v1) for several choices"
                                                    if inside else "when streaming"), "n")
        self.counters["requests"] += 1
        if n > 1:
            return web.json_response(whole(await self._samples(req, mode)))
        session = self._session_for(request)
        try:
            async with session.lock:
                plan = session.plan_chat(req) if mode == "chat" else session.plan_text(req)
                if on_plan is not None:
                    on_plan(plan)
                if not req.stream:
                    return web.json_response(whole([await session.complete(plan, mode, req.sampling)]))
                return await self._stream(request, session, plan, req, mode, pieces, finish)
        finally:
            session.last_used = time.monotonic()  # idle from the end of its latest request

    async def _stream(self, request: web.Request, session: Session, plan: Any, req: Any, mode: str,
                      pieces: Callable[[str, bool], list[dict]], finish: Callable[[Reply, str], list[dict]]):
        sse, streamed = Sse(request), []

        async def on_text(text: str) -> None:
            for chunk in pieces(text, not streamed):
                await sse.send(chunk)
            streamed.append(text)

        try:
            reply = await session.complete(plan, mode, req.sampling, on_text)
        except ProtocolError as exc:
            return await sse.fail(bounds.public(exc, f"{request.method} {request.path} (stream)"))
        for chunk in finish(reply, "".join(streamed)):
            await sse.send(chunk)
        await sse.done()
        return sse.response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        req = proto.parse_chat(await self._body(request))
        rid, model = proto.new_id("chatcmpl"), self.cfg.model_name
        opening = {"role": "assistant", "content": ""}

        def whole(replies: list[Reply]) -> dict:
            choices = []
            for reply in replies:
                message = {"role": "assistant", "content": reply.content}
                if reply.tool_calls:
                    message["tool_calls"] = proto.openai_tool_calls(reply.tool_calls)
                choices.append((message, reply.finish_reason))
            return proto.chat_response(rid, model, choices, _usage(replies))

        def pieces(text: str, first: bool) -> list[dict]:
            return [proto.chat_chunk(rid, model, d) for d in ([opening] if first else []) + [{"content": text}]]

        def finish(reply: Reply, streamed: str) -> list[dict]:
            content = reply.content or ""
            deltas = [] if streamed else [opening]
            if content.startswith(streamed) and content[len(streamed):]:
                deltas.append({"content": content[len(streamed):]})
            if reply.tool_calls:
                deltas.append({"tool_calls": [{"index": i, **c} for i, c in
                                              enumerate(proto.openai_tool_calls(reply.tool_calls))]})
            use = proto.usage(reply.prompt_tokens, reply.completion_tokens)
            return [proto.chat_chunk(rid, model, d) for d in deltas] + \
                [proto.chat_chunk(rid, model, {}, reply.finish_reason, use)]

        return await self._serve(request, req, "chat", whole, pieces, finish)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        req = proto.parse_completion(await self._body(request))
        rid, model = proto.new_id("cmpl"), self.cfg.model_name

        def whole(replies: list[Reply]) -> dict:
            return proto.completion_response(rid, model, [r.text for r in replies],
                                             [r.finish_reason for r in replies], _usage(replies))

        def finish(reply: Reply, streamed: str) -> list[dict]:
            rest = reply.text[len(streamed):] if reply.text.startswith(streamed) else ""
            use = proto.usage(reply.prompt_tokens, reply.completion_tokens)
            return [proto.completion_response(rid, model, rest, reply.finish_reason, use)]

        return await self._serve(request, req, "text", whole,
                                 lambda text, first: [proto.completion_response(rid, model, text, None, None)], finish)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        req = resp.parse_responses(await self._body(request))
        rid, model = proto.new_id("resp", "_"), self.cfg.model_name
        events = resp.ResponseEvents(rid, model, req.echo)

        def whole(replies: list[Reply]) -> dict:
            return resp.response_object(rid, model, req.echo, resp.output_items(replies[0]), replies[0])

        return await self._serve(request, req.chat, "chat", whole, lambda text, first: events.text(text),
                                 lambda reply, streamed: events.finish(reply))

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        req = msgs.parse_messages(await self._body(request))
        mid, model = msgs.new_message_id(), req.model or self.cfg.model_name
        events = msgs.MessageEvents(mid, model)

        def planned(plan: Any) -> None:
            events.input_tokens = len(plan.prompt)

        return await self._serve(request, req.chat, "chat", lambda replies: msgs.message(mid, model, replies[0]),
                                 lambda text, first: events.text(text), lambda reply, streamed: events.finish(reply),
                                 planned)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """The prompt a `/v1/messages` request would be, in tokens: planned on its session (or a
        throwaway ledger) without generating, so nothing is recorded."""
        body = await self._body(request)
        if isinstance(body, dict):
            body = {"max_tokens": 1, **body}  # count_tokens takes no max_tokens
        req = msgs.parse_messages(body)
        session = self._session_for(request)
        async with session.lock:
            plan = session.plan_chat(req.chat)
        return web.json_response({"input_tokens": len(plan.prompt)})


def _usage(replies: list[Reply]) -> dict[str, int]:
    """The prompt once (every choice shares it), the completions summed."""
    return proto.usage(replies[0].prompt_tokens, sum(r.completion_tokens for r in replies))
