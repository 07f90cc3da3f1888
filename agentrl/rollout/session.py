"""One session of the OpenAI endpoint = one episode's token ledger, kept exactly.

An agent on an OpenAI client re-sends the whole conversation with every request. The ledger does
not re-render it: when a request's messages are the conversation the ledger already holds (its
earlier messages plus the model's own replies, as returned) followed by new non-assistant messages,
only those are rendered, as `ChatFormat.continuation` suffixes, and appended, exactly as
`run_episode` does for an Env. Anything else (a rewritten or dropped message, changed tools, an
assistant message the model did not write) closes the ledger's current segment with the reason
and starts a new one from that request's full rendering, counted as `segments_split`: never a
silent re-tokenisation. Text completions (`/v1/completions`) extend the ledger when the new prompt
starts with the ledger's text (or token ids) and split otherwise.

A request changes the ledger only when its generation succeeds, so a failed or refused request
(engine error, context full) can be retried by the agent without splitting the episode.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from jinja2 import TemplateError

from agentrl.data.chat import ChatFormat
from agentrl.rollout.engine import Generation
from agentrl.rollout.openai_protocol import ChatRequest, CompletionRequest, ProtocolError, Sampling
from agentrl.rollout.tools.counts import record_tool_turn
from agentrl.rollout.tools import ToolCall, ToolFormat
from agentrl.types import Episode, Turn

Message = dict[str, Any]
OnText = Callable[[str], Awaitable[None]]


class ContextFull(ProtocolError):
    """The episode has no room (tokens or turns) for another generation: the episode is truncated."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "messages", 400, "context_length_exceeded")


class SessionEngineError(ProtocolError):
    """The engine failed this request; the episode ends with status engine_error. The client is told
    only that (the server logs `detail` under an error id): engine internals stay out of the body."""

    def __init__(self, detail: str) -> None:
        super().__init__("the engine failed this request", None, 500, "engine_error", kind="server_error")
        self.detail = detail


class ClientGone(Exception):
    """Streaming to the client failed (it disconnected): not the engine's failure, nothing to answer."""


@dataclass
class Limits:
    """What bounds a session. `temperature`/`top_p` set: training, where behaviour logprobs must come
    from the distribution the learner corrects against, so requests cannot change them."""

    max_model_len: int
    max_tokens: int  # per generation
    max_turns: int
    temperature: float | None = None
    top_p: float | None = None
    timeout_s: float | None = None  # per generation; a timeout ends a training episode with status timeout
    max_session_tokens: int | None = None  # tokens the ledger may hold over all its segments (agentrl.serve)


@dataclass
class Reply:
    """One generation as the endpoint returns it."""

    text: str  # the decoded turn, cut before a stop string
    content: str | None  # chat: the text before any tool call
    tool_calls: list[tuple[str, str, dict[str, Any]]]  # (id, name, arguments)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the request's stop string that ended the turn


@dataclass
class _Plan:
    """How a request would change the ledger, applied only after its generation succeeds."""

    prompt: list[int]  # what the engine sees: the ledger plus `add`
    add: list[int]  # tokens appended before the generation
    split: str | None  # why a new segment starts, or None
    fresh: bool  # `add` is a whole first prompt
    known: list[tuple] = field(default_factory=list)  # chat: the conversation's keys after this request
    messages: list[Message] = field(default_factory=list)  # chat: messages added to Episode.messages
    tools_key: str = ""  # chat: the tools the prompt was rendered with
    text: str = ""  # text completions: the ledger as text after this request's prompt


def message_key(m: Message) -> tuple:
    """What must match for a message to be the same one: role, text and tool calls (ids aside).
    A tuple, not a JSON string: every request compares its whole conversation against the ledger's."""
    calls = m.get("tool_calls")
    if not calls:
        return m["role"], m.get("content") or ""
    return m["role"], m.get("content") or "", tuple(
        (c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in calls)


class Session:
    def __init__(self, sid: str, fmt: ChatFormat, engine: Any, episode: Episode, limits: Limits,
                 tool_format: ToolFormat, counters: Counter) -> None:
        self.sid, self.fmt, self.engine, self.ep, self.limits = sid, fmt, engine, episode, limits
        self.tool_format, self.counters = tool_format, counters  # the model's tool-call format (rollout.tool_format)
        self.base_url = ""  # set by the server: <url>/sessions/<sid>/v1
        self.seed: int | None = None  # the episode's seed: requests without one sample with seed*1000 + turn
        self.mode: str | None = None  # "chat" | "text", once the ledger holds a prompt
        self.known: list[tuple] = []  # message_key of every message the ledger holds (chat)
        self.tools_key = ""
        self.text = ""  # the ledger as text (text completions)
        self.raw: dict[tuple, str] = {}  # key of a reply as returned -> what the model wrote
        self.call_names: dict[str, str] = {}  # tool_call_id -> function name
        self.ended = True  # the latest generation ended with EOS
        self.truncated = False
        self.timed_out = False
        self.engine_error: str | None = None
        self.requests = 0
        self.expires = False  # opened over HTTP: closed by the server after `server.session_idle_timeout_s` idle
        self.last_used = time.monotonic()
        self.lock = asyncio.Lock()  # the server serves one request of a session at a time, in arrival order

    # -- planning: how a request extends (or splits) the ledger ------------------------------------

    def _for_template(self, m: Message, key: tuple) -> Message:
        """`m` as the template renders it; `key` is its `message_key`. The model's replies are rendered
        as it wrote them (tool calls included), so the rendering matches the sampled tokens' text."""
        out = {"role": m["role"], "content": m.get("content") or ""}
        if m["role"] == "assistant":
            raw = self.raw.get(key)
            out["content"] = raw if raw is not None else out["content"] + self.tool_format.render(
                [ToolCall(c["name"], c["arguments"]) for c in m.get("tool_calls", [])])
        name = m.get("name") or self.call_names.get(m.get("tool_call_id") or "")
        if m["role"] == "tool" and name:
            out["name"] = name
        return out

    def _chat_problem(self, keys: list[tuple], tools_key: str, messages: list[Message]) -> str | None:
        if self.mode != "chat":
            return "the previous request was a text completion"
        if tools_key != self.tools_key:
            return "the request's tools differ from those the ledger's prompt was rendered with"
        n = len(self.known)
        for i, (new, old) in enumerate(zip(keys, self.known)):
            if new != old:
                return f"message {i} ({messages[i]['role']}) differs from the conversation the ledger holds"
        if len(keys) <= n:
            return f"the request has {len(keys)} messages, the ledger's conversation {n}: the agent dropped messages"
        for j, m in enumerate(messages[n:]):
            if m["role"] == "assistant":
                return f"message {n + j} is an assistant message the model did not write"
        return None

    def plan_chat(self, req: ChatRequest) -> _Plan:
        keys = [message_key(m) for m in req.messages]
        tools_key = json.dumps(req.tools, sort_keys=True) if req.tools else ""
        tokens = self.ep.tokens
        split = self._chat_problem(keys, tools_key, req.messages) if tokens else None
        if tokens and split is None:
            n = len(self.known)
            new = [self._for_template(m, k) for m, k in zip(req.messages[n:], keys[n:])]
            try:
                add = ([] if self.ended else [self.fmt.eos_id]) + self.fmt.continuation(new)
                return _Plan(tokens + add, add, None, False, keys, new, tools_key)
            except ValueError as exc:  # the template rewrites history for these messages: render anew
                split = str(exc)
        rendered = [self._for_template(m, k) for m, k in zip(req.messages, keys)]
        try:
            add = self.fmt.initial(rendered, tools=req.tools)
        except TemplateError as exc:
            raise ProtocolError(f"the model's chat template cannot render these messages: {exc}", "messages") from None
        return _Plan(add, add, split, True, keys, rendered, tools_key)

    def plan_text(self, req: CompletionRequest) -> _Plan:
        tokens, prompt = self.ep.tokens, req.prompt
        if isinstance(prompt, list):
            vocab = len(self.fmt.tokenizer)
            if any(not 0 <= t < vocab for t in prompt):
                raise ProtocolError(f"'prompt' holds token ids outside the vocabulary [0, {vocab})", "prompt")
            if tokens and self.mode == "text" and len(prompt) > len(tokens) and prompt[:len(tokens)] == tokens:
                return _Plan(list(prompt), list(prompt[len(tokens):]), None, False,
                             text=self.fmt.tokenizer.decode(prompt))
            split = "the prompt's tokens do not extend the ledger" if tokens else None
            return _Plan(list(prompt), list(prompt), split, True, text=self.fmt.tokenizer.decode(prompt))
        if tokens and self.mode == "text" and len(prompt) > len(self.text) and prompt.startswith(self.text):
            add = self.fmt.encode(prompt[len(self.text):])
            return _Plan(tokens + add, add, None, False, text=prompt)
        split = ("the previous request was a chat completion" if self.mode == "chat"
                 else "the prompt does not start with the ledger's text") if tokens else None
        add = self.fmt.encode(prompt)
        return _Plan(add, add, split, True, text=prompt)

    def _commit(self, plan: _Plan, mode: str) -> None:
        ep = self.ep
        if plan.split is not None:
            ep.start_segment(plan.split)
            ep.info.setdefault("ledger_splits", []).append(plan.split)
            self.counters["segments_split"] += 1
        if plan.fresh:
            ep.append(plan.add, generated=False)
            ep.prompt_len = len(plan.add)
            ep.messages = list(plan.messages)
            self.mode, self.ended = mode, True
        else:
            ep.append(plan.add, generated=False)
            ep.messages += plan.messages
            if ep.turns:
                ep.turns[-1].env_tokens += len(plan.add)
        if mode == "chat":
            self.known, self.tools_key = list(plan.known), plan.tools_key
        else:
            self.text = plan.text

    # -- generation ------------------------------------------------------------------------------

    def _sampling(self, s: Sampling) -> tuple[float, float]:
        lim = self.limits
        if lim.temperature is None:
            return (1.0 if s.temperature is None else s.temperature), (1.0 if s.top_p is None else s.top_p)
        if (s.temperature is not None and s.temperature != lim.temperature) or (
                s.top_p is not None and s.top_p != lim.top_p):
            self.counters["sampling_overridden"] += 1
        return lim.temperature, lim.top_p

    def _budget(self, plan: _Plan, s: Sampling) -> int:
        if len(self.ep.turns) >= self.limits.max_turns:
            self.truncated = True
            raise ContextFull(f"the episode reached its limit of {self.limits.max_turns} model turns")
        cap = self.limits.max_session_tokens
        held = len(self.ep.tokens) + sum(len(seg.tokens) for seg in self.ep.segments)
        left = cap - held - len(plan.add) if cap is not None else self.limits.max_tokens
        if left <= 0:  # the ledger's memory is the server's: bounded however a session splits
            self.truncated = True
            raise ContextFull(f"the session holds {held} tokens over all its segments, its limit is {cap} "
                              "(server.session_max_tokens): open a new session")
        room = self.limits.max_model_len - len(plan.prompt)
        if room <= 0:
            self.truncated = True
            raise ContextFull(f"the conversation is {len(plan.prompt)} tokens; the context holds "
                              f"{self.limits.max_model_len}")
        if s.max_tokens is not None and s.max_tokens > self.limits.max_tokens:  # visible, not silent
            self.counters["max_tokens_capped"] += 1
        return min(room, left, self.limits.max_tokens, s.max_tokens or self.limits.max_tokens)

    async def _sample(self, prompt: list[int], budget: int, s: Sampling, on_text: OnText | None) -> Generation:
        if s.seed is None and self.seed is not None:
            s = replace(s, seed=self.seed * 1000 + len(self.ep.turns))
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                return await self._sample_now(prompt, budget, s, on_text)
        except TimeoutError:
            self.timed_out = True
            raise ProtocolError(f"the generation took longer than {self.limits.timeout_s} s", None, 504,
                                "timeout", kind="server_error") from None

    async def _sample_now(self, prompt: list[int], budget: int, s: Sampling, on_text: OnText | None) -> Generation:
        temperature, top_p = self._sampling(s)
        stream = getattr(self.engine, "stream", None)
        try:
            if stream is None or on_text is None and not s.stop:
                return await self.engine.generate(prompt, budget, temperature, top_p, s.seed)
            gen, shown = Generation(), 0
            agen = stream(prompt, budget, temperature, top_p, s.seed)
            try:
                async for delta in agen:
                    gen.token_ids += delta.token_ids
                    gen.logprobs += delta.logprobs
                    gen.versions += delta.versions
                    gen.finish_reason = delta.finish_reason or gen.finish_reason
                    visible = self._visible(gen.token_ids, s.stop)
                    if visible is None:  # a stop string was written: stop sampling (vLLM aborts the request)
                        break
                    if on_text is not None and len(visible) > shown:
                        try:
                            await on_text(visible[shown:])
                        except (ConnectionError, RuntimeError) as exc:  # aiohttp: the transport is closing
                            raise ClientGone(str(exc)) from exc
                        shown = len(visible)
            finally:
                if hasattr(agen, "aclose"):
                    await agen.aclose()
            return gen
        except (ProtocolError, ClientGone, asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:  # vLLM errors, a dead engine: this request fails, the agent sees a 500
            self.engine_error = f"{type(exc).__name__}: {exc}"
            raise SessionEngineError(self.engine_error) from exc

    def _visible(self, ids: list[int], stop: list[str]) -> str | None:
        """Text safe to stream so far: None once a stop string appears; held back while the text ends
        with what may become a stop string, a tool call's opening tag or an incomplete character."""
        body = ids[:-1] if ids and ids[-1] == self.fmt.eos_id else ids
        text = self.fmt.tokenizer.decode(body)
        if any(s in text for s in stop):
            return None
        start = self.tool_format.start_marker
        text = self.tool_format.cut(text)
        hold = 0
        for marker in [*stop, *([start] if start else [])]:
            for k in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:k]):
                    hold = max(hold, k)
                    break
        text = text[:len(text) - hold]
        return text.rstrip("\ufffd")

    def _cut_at_stop(self, ids: list[int], stop: list[str]) -> tuple[list[int], str, str | None]:
        """(tokens kept, text returned, the stop string that ended the turn or None): the shortest prefix
        of the sampled tokens that contains the first stop string; the text ends before it."""
        text = self.fmt.tokenizer.decode(ids)
        hits = [(text.find(s), s) for s in stop if s in text]
        if not hits:
            return ids, text, None
        at, first = min(hits)
        for k in range(1, len(ids) + 1):
            if len(self.fmt.tokenizer.decode(ids[:k])) > at and any(
                    s in self.fmt.tokenizer.decode(ids[:k]) for s in stop):
                return ids[:k], text[:at], first
        return ids, text[:at], first

    async def complete(self, plan: _Plan, mode: str, s: Sampling, on_text: OnText | None = None) -> Reply:
        """Generate after `plan`, then commit the plan and the generation to the ledger."""
        self.requests += 1
        budget = self._budget(plan, s)
        gen = await self._sample(plan.prompt, budget, s, on_text)
        ended = bool(gen.token_ids) and gen.token_ids[-1] == self.fmt.eos_id
        body = gen.token_ids[:-1] if ended else gen.token_ids
        kept, text, stopped = self._cut_at_stop(body, s.stop)
        if stopped:
            ended = False
        n = len(kept) + (1 if ended else 0)
        self._commit(plan, mode)
        ep = self.ep
        start = len(ep.tokens)
        ep.append(gen.token_ids[:n], generated=True, logprobs=gen.logprobs[:n], versions=gen.versions[:n])
        raw = self.fmt.tokenizer.decode(kept)
        ep.turns.append(Turn(start=start, n_generated=n, text=raw))
        ep.messages.append({"role": "assistant", "content": raw})
        self.ended = ended
        finish = "stop" if ended or stopped else "length"
        reply = Reply(text, text, [], finish, len(plan.prompt), n, stopped)
        if mode == "chat":
            self._record_reply(reply)
        else:
            self.text += raw + (self.fmt.eos_text if ended else "")
        return reply

    def _record_reply(self, reply: Reply) -> None:
        calls, error = self.tool_format.parse(reply.text)
        record_tool_turn(self.ep.info, calls, error)
        if calls and error is None:
            reply.tool_calls = [(f"call_{uuid.uuid4().hex[:24]}", c.name, c.arguments) for c in calls]
            before = self.tool_format.cut(reply.text)
            reply.content = before if before.strip() else None
            reply.finish_reason = "tool_calls"
            self.call_names.update({cid: name for cid, name, _ in reply.tool_calls})
        message = {"role": "assistant", "content": reply.content or "",
                   "tool_calls": [{"name": n, "arguments": a} for _, n, a in reply.tool_calls]}
        key = message_key(message)
        self.raw[key] = self.ep.turns[-1].text
        self.known.append(key)
