"""The client side of bench/openai_server.py, in its own process so the clients' work is not on the
server's loop: the seeded multi-turn conversations, sent as chat completions or as Messages API requests
(aiohttp on uvloop, one connection per session). Jobs arrive as JSON lines on stdin; results go out the same way."""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import median, run_uvloop

MARK = re.compile(r"\[s(\d+) t(\d+)\]")  # what a user message ends with
OWNER = re.compile(r"\bs(\d+) t\d+")  # a marker or a reply: the session it belongs to
WORDS = "the keeper climbed stairs again counting each step as storm grew louder over dark sea".split()


# -- the conversations (shared by client and server) ---------------------------------------------------

def user_text(i: int, t: int, seed: int) -> str:
    """Session i's user message of turn t: a few seeded words (ledgers differ in length), then the marker."""
    rng = random.Random(f"{seed}:{i}:{t}")
    return " ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + f". [s{i} t{t}]"


def reply_text(i: int, t: int) -> str:
    return f"s{i} t{t} done"


def opening(i: int, seed: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a storyteller."},
            {"role": "user", "content": user_text(i, 0, seed)}]


def conversation(i: int, turns: int, seed: int) -> list[dict[str, Any]]:
    """Session i's finished conversation when every request was answered by the rule."""
    messages = opening(i, seed)
    for t in range(turns):
        messages.append({"role": "assistant", "content": reply_text(i, t)})
        if t + 1 < turns:
            messages.append({"role": "user", "content": user_text(i, t + 1, seed)})
    return messages


# -- client process --------------------------------------------------------------------------------------

def request(api: str, url: str, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The turn's (URL, body) on chat completions or on the Messages API (system prompt on top)."""
    if api == "chat":
        return f"{url}/chat/completions", {"model": "agentrl", "messages": messages, "max_tokens": 16}
    return f"{url}/messages", {"model": "agentrl", "system": messages[0]["content"], "messages": messages[1:],
                               "max_tokens": 16}


def answer(api: str, body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The assistant message as the client sends it back, and its text."""
    if api == "chat":
        message = body["choices"][0]["message"]
        return message, message.get("content")
    return {"role": "assistant", "content": body["content"]}, body["content"][0]["text"]


async def converse(http, url: str, i: int, turns: int, seed: int, out: dict[str, Any], api: str) -> None:
    messages = opening(i, seed)
    for t in range(turns):
        target, ask = request(api, url, messages)
        t0 = time.perf_counter()
        try:
            async with http.post(target, json=ask) as resp:
                body = await resp.json() if resp.status == 200 else await resp.text()
        except Exception as exc:  # a dropped connection or timeout: counted, the conversation ends
            out["failed"] += 1
            out["first_error"] = out["first_error"] or repr(exc)
            return
        out["latency"].append(time.perf_counter() - t0)
        if resp.status != 200:
            out["non200"] += 1
            out["first_error"] = out["first_error"] or f"{resp.status}: {body[:300]}"
            return
        out["answered"] += 1
        message, text = answer(api, body)
        out["wrong_reply"] += text != reply_text(i, t)
        messages += [message, {"role": "user", "content": user_text(i, t + 1, seed)}]


async def client_job(job: dict[str, Any]) -> dict[str, Any]:
    """Open one connection per session, say "ready", wait for "go" on stdin, run every conversation."""
    import aiohttp

    urls, turns, seed = job["urls"], job["turns"], job["seed"]
    out: dict[str, Any] = dict(answered=0, non200=0, failed=0, wrong_reply=0, first_error="", latency=[])
    order = list(range(len(urls)))
    random.Random(seed).shuffle(order)  # sessions start in a seeded order, not by index
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:
        async def warm(url: str) -> None:
            async with http.get(f"{url}/models") as resp:
                await resp.read()

        await asyncio.gather(*(warm(u) for u in urls))
        print("ready", flush=True)
        sys.stdin.readline()  # blocking is fine: this loop has nothing else to do until "go"
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(converse(http, urls[i], i, turns, seed, out, job["api"]) for i in order))
        out["wall_s"], out["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    lat = sorted(out.pop("latency")) or [float("nan")]
    out["p50_ms"], out["p99_ms"] = median(lat) * 1e3, lat[int(0.99 * (len(lat) - 1))] * 1e3
    return out


def client_main() -> None:
    for line in sys.stdin:
        print(json.dumps(run_uvloop(client_job(json.loads(line)))), flush=True)


if __name__ == "__main__":
    client_main()
