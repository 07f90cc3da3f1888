"""Reference HTTP verifier: scores the completion's last number against task["answer"].

Run it with `python -m rewards.servers.verifier --port 8000` and point the client at
`http://127.0.0.1:8000/verify` (see rewards.http_verifier for the wire protocol).

    POST /verify        {"episode_id", "task": {"answer": ...}, "messages", "completion"}
                        -> 200 {"reward": 0.0 | 1.0, "info": {"episode_id", "predicted", "replayed"}}
                        -> 400 {"error": ...} when the request cannot be scored (clients must not retry):
                           not JSON, no task.answer, `messages` not a list of {"role", "content"} objects
                        -> 500 {"error": "... error id ..."} only for the server's own failure (logged)
    GET  /health        -> 200 {"status": "ok"}
    --fail-rate / --hang-rate / --garbage-rate inject 500s, hangs and non-JSON bodies (for testing a setup)
    GET  /stats         -> 200 {"requests", "in_flight", "max_in_flight"}; POST /stats/reset zeroes them

A repeated Idempotency-Key (a client retry) is answered from a bounded cache of recent results, so
a verifier with side effects or randomness gives every retry the answer of the first attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from rewards.rules import last_assistant_text, last_number, numeric_match
from rewards.servers import errors, read_json, run_server


@dataclass
class ServerStats:
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0


STATS = web.AppKey("stats", ServerStats)
CACHE = web.AppKey("cache", OrderedDict)
DELAY_S = web.AppKey("delay_s", float)
CACHE_SIZE = web.AppKey("cache_size", int)
FAULTS = web.AppKey("faults", object)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _track(request: web.Request, handler: Handler) -> web.StreamResponse:
    stats = request.app[STATS]
    stats.requests += 1
    stats.in_flight += 1
    stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
    try:
        return await handler(request)
    finally:
        stats.in_flight -= 1


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def score(request_body: Any) -> dict[str, Any]:
    """The verifier's pure scoring function; raises ValueError for a request it cannot score."""
    if not isinstance(request_body, dict):
        raise ValueError("request body must be a JSON object")
    task = request_body.get("task")
    if not isinstance(task, dict) or "answer" not in task:
        raise ValueError("request needs task.answer")
    messages = _messages(request_body.get("messages"))
    completion = request_body.get("completion")
    if not isinstance(completion, str):
        completion = last_assistant_text(messages)
    try:
        reward = numeric_match(completion, task["answer"])
    except OverflowError:  # an integer answer past float range
        raise ValueError(f"task.answer is out of range: {str(task['answer'])[:40]}...") from None
    return {"reward": reward, "info": {"episode_id": request_body.get("episode_id"),
                                       "predicted": last_number(completion)}}


def _messages(messages: Any) -> list[dict[str, Any]]:
    """`messages` checked: a list of objects with a string role and string, list or null content."""
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise ValueError(f"'messages' must be a list of {{'role', 'content'}} objects, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"'messages[{i}]' must be an object with a string 'role'")
        content = m.get("content")
        parts_ok = isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content)
        if not (content is None or isinstance(content, str) or parts_ok):
            raise ValueError(f"'messages[{i}].content' must be a string, null or a list of "
                             "{'type': 'text', 'text': str} parts")
    return messages


async def verify(request: web.Request) -> web.Response:
    app = request.app
    if app[DELAY_S] > 0:
        await asyncio.sleep(app[DELAY_S])  # simulated scoring cost, for load tests
    key = request.headers.get("Idempotency-Key")
    cache = app[CACHE]
    if key and key in cache:
        cache.move_to_end(key)
        return web.json_response({**cache[key], "info": {**cache[key]["info"], "replayed": True}})
    fault = await _inject_fault(app[FAULTS])
    if fault is not None:
        return fault
    try:
        result = score(await read_json(request))
    except ValueError as exc:  # BadRequestBody (not JSON) is one too
        return _bad_request(str(exc))
    result["info"]["replayed"] = False
    if key:
        cache[key] = result
        if len(cache) > app[CACHE_SIZE]:
            cache.popitem(last=False)
    return web.json_response(result)


@dataclass
class Faults:
    """Failure injection for testing a training setup against a misbehaving verifier: each request
    independently gets a 500, a hang of `hang_s`, or a non-JSON body, with these probabilities."""

    fail_rate: float = 0.0
    hang_rate: float = 0.0
    garbage_rate: float = 0.0
    hang_s: float = 30.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))


async def _inject_fault(faults: Faults) -> web.Response | None:
    u = faults.rng.random()
    if u < faults.fail_rate:
        return web.json_response({"error": "injected failure"}, status=500)
    if u < faults.fail_rate + faults.hang_rate:
        await asyncio.sleep(faults.hang_s)
        return web.json_response({"error": "injected hang"}, status=503)
    if u < faults.fail_rate + faults.hang_rate + faults.garbage_rate:
        return web.Response(text="<html>not json", content_type="application/json")
    return None


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(asdict(request.app[STATS]))


async def reset_stats(request: web.Request) -> web.Response:
    current = request.app[STATS]
    current.requests, current.max_in_flight = 0, current.in_flight
    return web.json_response(asdict(current))


def make_app(*, delay_s: float = 0.0, cache_size: int = 10_000, faults: Faults | None = None) -> web.Application:
    """The verifier as an aiohttp app; `delay_s` adds a per-request sleep to simulate scoring cost,
    `faults` injects failures."""
    app = web.Application(middlewares=[errors, _track])
    app[FAULTS] = faults or Faults()
    app[STATS] = ServerStats()
    app[CACHE] = OrderedDict()
    app[DELAY_S] = float(delay_s)
    app[CACHE_SIZE] = int(cache_size)
    app.router.add_post("/verify", verify)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_post("/stats/reset", reset_stats)
    return app


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delay-ms", type=float, default=0.0, help="simulated scoring time per request")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="fraction of requests answered 500")
    parser.add_argument("--hang-rate", type=float, default=0.0, help="fraction of requests that hang --hang-s")
    parser.add_argument("--garbage-rate", type=float, default=0.0, help="fraction answered with a non-JSON body")
    parser.add_argument("--hang-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault injection")


def _app(args: argparse.Namespace) -> web.Application:
    faults = Faults(args.fail_rate, args.hang_rate, args.garbage_rate, args.hang_s, random.Random(args.seed))
    return make_app(delay_s=args.delay_ms / 1000, faults=faults)


def main(argv: list[str] | None = None) -> None:
    run_server(argv, __doc__.splitlines()[0], 8000, "verifier", _app, _arguments,
               risk="anyone who can reach this port can have answers scored and read the scores")


if __name__ == "__main__":
    main()
