"""1,000 concurrent sessions on the OpenAI endpoint against an in-memory engine, server and aiohttp
client on one event loop: every request answered, every session's ledger exactly its own conversation
(`ledger_from_messages`), nothing of one session in another's, and every session closed afterwards.

The engine's reply names the session and turn written at the end of the prompt's last user message
("s12 t1 done" for "[s12 t1]"), so a request served on another session's ledger would show in both
the reply and the ledger. bench/openai_server.py measures the same load's event-loop cost.
"""

from __future__ import annotations

import asyncio
import re
import resource

import aiohttp

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import ServerConfig
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import get_tool_format
from agentrl.types import Episode
from tests.fake_engine import ScriptedEngine

SESSIONS, TURNS = 1000, 2
CONNECTIONS = 256  # all sessions in flight, sharing connections: ~2 descriptors each on this one process
MARK = re.compile(r"\[s(\d+) t(\d+)\]")
OWNER = re.compile(r"\bs(\d+) t\d+")  # a marker or a reply


def user_text(i: int, t: int) -> str:
    return f"{'Go on. ' * (i % 5 + 1)}[s{i} t{t}]"  # lengths differ between sessions


def reply_text(i: int, t: int) -> str:
    return f"s{i} t{t} done"


def conversation(i: int) -> list[dict]:
    """Session i's finished conversation when every request is answered by the engine's rule."""
    messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": user_text(i, 0)}]
    for t in range(TURNS):
        messages.append({"role": "assistant", "content": reply_text(i, t)})
        if t + 1 < TURNS:
            messages.append({"role": "user", "content": user_text(i, t + 1)})
    return messages


class YieldingEngine(ScriptedEngine):
    """Answers after one event-loop pass, as a real engine wakes each request once per step, so the
    sessions' requests interleave; `peak` is the most generations in flight at once."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, self._rule)
        self.in_flight = self.peak = 0

    def _rule(self, prompt_ids: list[int], index: int) -> str:
        i, t = MARK.findall(self.tokenizer.decode(prompt_ids[-48:]))[-1]
        return reply_text(int(i), int(t))

    async def generate(self, *args, **kwargs):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return await super().generate(*args, **kwargs)


async def converse(http: aiohttp.ClientSession, url: str, i: int) -> list[tuple[int, str | None]]:
    """(status, reply content) per turn; the whole conversation re-sent each turn, as an agent does."""
    messages = conversation(i)[:2]
    out = []
    for t in range(TURNS):
        async with http.post(f"{url}/chat/completions", json={"model": "agentrl", "messages": messages}) as resp:
            if resp.status != 200:
                return out + [(resp.status, await resp.text())]
            message = (await resp.json())["choices"][0]["message"]
        out.append((200, message["content"]))
        messages += [message, {"role": "user", "content": user_text(i, t + 1)}]
    return out


def ensure_open_files(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


async def close_all(http: aiohttp.ClientSession, server: OpenAIServer, sessions) -> list[int]:
    async def close(s) -> int:
        async with http.delete(f"{server.url}/sessions/{s.sid}") as resp:
            return resp.status
    return await asyncio.gather(*(close(s) for s in sessions))


async def scenario(fmt: ChatFormat) -> None:
    engine = YieldingEngine(fmt.tokenizer)
    server = OpenAIServer(fmt, ServerConfig(), get_tool_format("hermes"), Limits(2048, 32, TURNS))
    await server.start()
    try:
        sessions = [server.open_session(engine, Episode(f"s{i}", i)) for i in range(SESSIONS)]
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=50)) as http:
            results = await asyncio.gather(*(converse(http, s.base_url, i) for i, s in enumerate(sessions)))
            for i, turns in enumerate(results):
                assert turns == [(200, reply_text(i, t)) for t in range(TURNS)], f"session {i}: {turns}"
            assert engine.peak > CONNECTIONS // 4, "the sessions' requests did not overlap"
            check_ledgers(fmt, sessions)
            stats = server.stats()
            assert stats["ledger/segments_split"] == 0
            assert stats["ledger/requests"] == SESSIONS * TURNS
            assert await close_all(http, server, sessions) == [200] * SESSIONS
            assert not server.sessions
            async with http.post(f"{sessions[0].base_url}/chat/completions",
                                 json={"messages": conversation(0)[:2]}) as resp:
                assert resp.status == 404  # closed means gone
    finally:
        await server.stop()


def check_ledgers(fmt: ChatFormat, sessions) -> None:
    for i, s in enumerate(sessions):
        ep = s.ep
        tokens, mask = ledger_from_messages(fmt, conversation(i))
        assert (ep.tokens, ep.loss_mask) == (tokens, mask), f"session {i}'s ledger is not its conversation"
        assert not ep.segments, f"session {i} split its ledger"
        assert {int(k) for k in OWNER.findall(fmt.tokenizer.decode(ep.tokens))} == {i}, f"session {i} mixed"


def test_thousand_concurrent_sessions(tiny_tokenizer) -> None:
    ensure_open_files(4 * CONNECTIONS)
    asyncio.run(asyncio.wait_for(scenario(ChatFormat(tiny_tokenizer)), timeout=55))
