"""The OpenAI endpoint under 1,000 concurrent agent sessions: every request answered, the event-loop cost
per request (goal < 1 ms), and every session's ledger exact with none mixed between sessions; then the
same conversations through Anthropic's Messages API (/v1/messages) on fresh sessions, side by side
(goal: requests/s and latency within 5 % of chat completions).

    .venv/bin/python bench/openai_server.py [--sessions 1000] [--turns 4] [--seed 0] [--apis chat,messages]

This process runs `OpenAIServer` on uvloop (the loop train.py uses) with an in-memory engine that
answers each generation after one event-loop pass (a real engine wakes each request once per engine
step). Its reply names the session and turn written at the end of the prompt's last user message
("s12 t3 done" for "[s12 t3]"), so a request that reached another session's ledger shows there.

It opens every session up front and hands the base URLs to a client process (bench/_chat_clients.py:
aiohttp on uvloop, one connection per session), so the clients' work is not on the server's loop.
Each session is a multi-turn conversation, as an agent sends it: every turn re-sends the whole
conversation plus the assistant reply as returned plus a new user message. Connections are opened
(one GET /v1/models per session) before the measured phase.

Measured in this process over the request phase: CPU seconds (user + system, this process only) per
request = the event-loop cost, wall time and requests/s; the client reports answered requests,
non-200s, replies that were not the session's own, and latencies. A second phase sends the same
conversations to a canned handler on the same aiohttp stack (JSON in, the rule's reply out, no
ledger) for the HTTP + JSON floor; during the real phase `Session.plan_chat`, `Session.complete` and
the engine stub are timed (wall, summed) for the breakdown. Afterwards every session's ledger is
compared with `ledger_from_messages` of its own conversation. Tables on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._chat_clients import MARK, OWNER, conversation, reply_text
from bench._common import median, print_host, progress, run_uvloop, table

TAIL = 48  # prompt tokens the engine decodes: the last user message's end and the generation header
GOAL_MS = 1.0


# -- server process ----------------------------------------------------------------------------------------

class MarkerEngine:
    """In-memory GenerateFn: the rule's reply to the prompt's last marker, after one event-loop pass.
    `own_s`: its own (synchronous) seconds; `waits`: per task, the seconds its await took."""

    def __init__(self, fmt) -> None:
        self.fmt, self.own_s, self.waits = fmt, 0.0, {}

    async def generate(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, seed=None):
        from agentrl.rollout.engine import Generation

        t0 = time.perf_counter()
        i, t = MARK.findall(self.fmt.tokenizer.decode(prompt_ids[-TAIL:]))[-1]
        ids = self.fmt.encode(reply_text(int(i), int(t)))[:max_tokens - 1] + [self.fmt.eos_id]
        t1 = time.perf_counter()
        await asyncio.sleep(0)
        self.waits[asyncio.current_task()] = time.perf_counter() - t1
        self.own_s += t1 - t0
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")


class Breakdown:
    """Wall seconds inside Session.plan_chat and Session.complete (less the engine's await), summed;
    patched onto Session in this process only, for the real phase."""

    def __init__(self, engine: MarkerEngine) -> None:
        self.engine, self.plan_s, self.complete_s = engine, 0.0, 0.0

    def install(self):
        from agentrl.rollout.session import Session

        plan, complete = Session.plan_chat, Session.complete

        def timed_plan(session, req):
            t0 = time.perf_counter()
            try:
                return plan(session, req)
            finally:
                self.plan_s += time.perf_counter() - t0

        async def timed_complete(session, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await complete(session, *args, **kwargs)
            finally:
                wait = self.engine.waits.pop(asyncio.current_task(), 0.0)
                self.complete_s += time.perf_counter() - t0 - wait

        Session.plan_chat, Session.complete = timed_plan, timed_complete

        def restore() -> None:
            Session.plan_chat, Session.complete = plan, complete
        return restore


@dataclass
class Phase:
    name: str
    requests: int
    wall_s: float
    user_s: float
    sys_s: float
    client: dict[str, Any]

    @property
    def ms_per_request(self) -> float:
        return (self.user_s + self.sys_s) * 1e3 / max(self.requests, 1)


async def measured(proc, name: str, urls: list[str], turns: int, seed: int, api: str = "chat") -> Phase:
    """One client job; this process's CPU and wall time between "go" and the client's result."""
    proc.stdin.write(json.dumps({"urls": urls, "turns": turns, "seed": seed, "api": api}).encode() + b"\n")
    await proc.stdin.drain()
    ready = await proc.stdout.readline()
    if ready.strip() != b"ready":
        raise RuntimeError(f"the client process did not start its job: {ready!r}")
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    line = await proc.stdout.readline()
    w1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    client = json.loads(line)
    progress(f"{name}: {client['answered']} answered in {w1 - w0:.2f} s")
    return Phase(name, len(urls) * turns, w1 - w0, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, client)


def canned_app():
    """The endpoint's routes on the same aiohttp stack with none of its work: JSON in, the rule's reply out."""
    from aiohttp import web

    from agentrl.rollout import openai_protocol as proto

    async def chat(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        i, t = MARK.findall(body["messages"][-1]["content"])[-1]
        message = {"role": "assistant", "content": reply_text(int(i), int(t))}
        return web.json_response(proto.chat_response(proto.new_id("chatcmpl"), "agentrl", [(message, "stop")],
                                                     proto.usage(0, 0)))

    async def models(request: web.Request) -> web.Response:
        return web.json_response(proto.models_response("agentrl"))

    app = web.Application()
    app.router.add_post("/sessions/{sid}/v1/chat/completions", chat)
    app.router.add_get("/sessions/{sid}/v1/models", models)
    return app


async def canned_phase(proc, sids: list[str], turns: int, seed: int) -> Phase:
    from aiohttp import web

    runner = web.AppRunner(canned_app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
    port = runner.addresses[0][1]
    try:
        return await measured(proc, "canned", [f"http://127.0.0.1:{port}/sessions/{s}/v1" for s in sids],
                              turns, seed)
    finally:
        await runner.cleanup()


def check_ledgers(fmt, sessions, turns: int, seed: int) -> tuple[int, int]:
    """(sessions whose ledger is exactly their own conversation's, sessions holding another's marker)."""
    from agentrl.data.chat import ledger_from_messages

    exact = mixed = 0
    for i, session in enumerate(sessions):
        ep = session.ep
        tokens, mask = ledger_from_messages(fmt, conversation(i, turns, seed))
        exact += ep.tokens == tokens and ep.loss_mask == mask and not ep.segments
        mixed += {int(s) for s in OWNER.findall(fmt.tokenizer.decode(ep.tokens))} != {i}
    return exact, mixed


async def serve_and_measure(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from agentrl.data.chat import ChatFormat
    from agentrl.config import DefaultModelConfig, ServerConfig
    from agentrl.models.default import build_tokenizer
    from agentrl.rollout.openai_server import OpenAIServer
    from agentrl.rollout.session import Limits
    from agentrl.rollout.tools import get_tool_format
    from agentrl.types import Episode

    fmt = ChatFormat(build_tokenizer(DefaultModelConfig(), tempfile.mkdtemp()))
    engine = MarkerEngine(fmt)
    server = OpenAIServer(fmt, ServerConfig(), get_tool_format("hermes"), Limits(4096, 64, args.turns + 1))
    await server.start()
    sessions = [server.open_session(engine, Episode(f"s{i}", i)) for i in range(args.sessions)]
    progress(f"server on {server.url}, {len(sessions)} sessions open; starting the client process")
    client = str(Path(__file__).with_name("_chat_clients.py"))
    proc = await asyncio.create_subprocess_exec(sys.executable, client, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, limit=2**24)
    try:
        breakdown = Breakdown(engine)
        restore = breakdown.install()
        try:
            real = await measured(proc, "endpoint", [s.base_url for s in sessions], args.turns, args.seed)
        finally:
            restore()
        canned = await canned_phase(proc, [s.sid for s in sessions], args.turns, args.seed)
        side = []  # (api, phase, ledgers exact, ledgers mixed): the APIs alternated on fresh sessions, warm
        for rnd in range(args.rounds):
            for api in dict.fromkeys(args.apis.split(",")):
                group = [server.open_session(engine, Episode(f"s{i}", i)) for i in range(args.sessions)]
                phase = await measured(proc, f"{api} #{rnd + 1}", [s.base_url for s in group], args.turns,
                                       args.seed, api)
                side.append((api, phase, *check_ledgers(fmt, group, args.turns, args.seed)))
                for s in group:
                    server.close_session(s.sid)
    finally:
        proc.stdin.close()
        await proc.wait()
    progress("checking every ledger")
    exact, mixed = check_ledgers(fmt, sessions, args.turns, args.seed)
    stats = server.stats()
    for s in sessions:
        server.close_session(s.sid)
    await server.stop()
    return dict(real=real, canned=canned, breakdown=breakdown, exact=exact, mixed=mixed, stats=stats,
                open_after=len(server.sessions), side=side)


# -- report ------------------------------------------------------------------------------------------------

def phase_row(p: Phase) -> list[str]:
    c = p.client
    return [p.name, f"{p.requests}", f"{c['answered']}", f"{c['non200']}", f"{c['failed']}", f"{c['wrong_reply']}",
            f"{p.wall_s:.2f}", f"{p.requests / p.wall_s:.0f}", f"{p.ms_per_request:.3f}",
            f"{p.user_s:.2f}/{p.sys_s:.2f}", f"{c['cpu_s']:.2f}", f"{c['p50_ms']:.1f}", f"{c['p99_ms']:.1f}"]


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    real, canned, b = r["real"], r["canned"], r["breakdown"]
    heads = ["handler", "requests", "answered", "non-200", "failed", "wrong reply", "wall s", "req/s",
             "server CPU ms/req", "user/sys s", "client CPU s", "p50 ms", "p99 ms"]
    print(table(heads, [phase_row(real), phase_row(canned)],
                f"OpenAI endpoint: {args.sessions} concurrent sessions x {args.turns} turns, in-memory engine, "
                "uvloop, clients in another process"), flush=True)
    print()
    n = real.requests
    parts = [("HTTP + JSON floor (the canned handler's CPU)", canned.ms_per_request),
             ("Session.plan_chat (wall)", b.plan_s * 1e3 / n),
             ("Session.complete, less the engine (wall)", (b.complete_s - b.engine.own_s) * 1e3 / n),
             ("in-memory engine stub: decode tail, encode reply (wall)", b.engine.own_s * 1e3 / n)]
    rest = real.ms_per_request - sum(ms for _, ms in parts)
    rows = [["server CPU, the whole endpoint", f"{real.ms_per_request:.3f}"]]
    rows += [[f"  {name}", f"{ms:.3f}"] for name, ms in parts]
    rows += [["  rest: parse_chat, session lookup and lock, response body", f"{rest:.3f}"]]
    print(table(["per request (server process)", "ms"], rows, "Where a request's server time goes"), flush=True)
    print()
    cost = real.ms_per_request
    print(f"event-loop cost per request: {cost:.3f} ms (goal < {GOAL_MS:g} ms): {cost / GOAL_MS:.2f}x the goal, "
          f"{'met' if cost < GOAL_MS else 'NOT met'}")
    print(f"every request answered: {'yes' if real.client['answered'] == n else 'NO'} "
          f"({real.client['answered']}/{n}, server counted {r['stats'].get('ledger/requests', 0):.0f})")
    print(f"ledgers exact: {r['exact']}/{args.sessions}")
    print(f"sessions holding another session's text: {r['mixed']}; "
          f"segments split: {r['stats'].get('ledger/segments_split', 0):.0f}; open after closing: {r['open_after']}")
    if real.client["first_error"]:
        print(f"first client error: {real.client['first_error']}")
    if r["side"]:
        print()
        print(table(heads + ["ledgers exact", "mixed"], [phase_row(p) + [f"{e}/{args.sessions}", f"{m}"]
                                                         for _, p, e, m in r["side"]],
                    "The same conversations through each API, alternated on fresh sessions (no breakdown timers)"))
    by = {api: [p for a, p, _, _ in r["side"] if a == api] for api, *_ in r["side"]}
    rate = {api: median([p.requests / p.wall_s for p in ps]) for api, ps in by.items()}
    p50 = {api: median([p.client["p50_ms"] for p in ps]) for api, ps in by.items()}
    cpu = {api: median([p.ms_per_request for p in ps]) for api, ps in by.items()}
    for api in (a for a in by if a != "chat" and "chat" in by):
        ok = rate[api] / rate["chat"] >= 0.95 and p50[api] / p50["chat"] <= 1.05
        print(f"{api} vs chat (medians of {len(by[api])} rounds): req/s {rate[api]:.0f} vs {rate['chat']:.0f} = "
              f"{rate[api] / rate['chat']:.3f}x, p50 latency {p50[api]:.1f} vs {p50['chat']:.1f} ms = "
              f"{p50[api] / p50['chat']:.3f}x, server CPU {cpu[api]:.3f} vs {cpu['chat']:.3f} ms/req = "
              f"{cpu[api] / cpu['chat']:.3f}x (goal: within 5 %: {'met' if ok else 'NOT met'})")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=4, help="chat requests per session")
    parser.add_argument("--seed", type=int, default=0, help="user messages and the order sessions start in")
    parser.add_argument("--apis", default="chat,messages", help="the side-by-side phases, in order")
    parser.add_argument("--rounds", type=int, default=3, help="times each side-by-side phase runs, alternated")
    return parser.parse_args(argv)


if __name__ == "__main__":
    cli = parse_args()
    print_host()
    report(run_uvloop(serve_and_measure(cli)), cli)
