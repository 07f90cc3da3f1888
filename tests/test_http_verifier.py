"""HttpVerifier against real aiohttp servers on loopback that misbehave on purpose.

Each test runs its own event loop (asyncio.run) and its own server on an ephemeral port. Timing
claims are checked with timestamps the server records, not with client wall-clock asserts.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import httpx
import pytest
from aiohttp import web

from agentrl.types import Episode
from rewards.http_verifier import HttpVerifier, VerifierConfig, episode_key
from rewards.rules import as_reward, exact_match, numeric_match, regex_format, rule_reward
from rewards.servers import serve
from rewards.servers.verifier import make_app

Behaviour = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    t: float  # server-side time.monotonic() when the request arrived
    headers: dict[str, str]
    body: Any


def scripted_app(*behaviours: Behaviour) -> tuple[web.Application, list[Seen]]:
    """An app whose n-th POST /verify gets behaviours[n] (the last one repeats)."""
    seen: list[Seen] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        t = time.monotonic()
        raw = await request.read()
        seen.append(Seen(t, dict(request.headers), json.loads(raw)))
        return await behaviours[min(len(seen), len(behaviours)) - 1](request)

    app = web.Application()
    app.router.add_post("/verify", handler)
    return app, seen


def ok(reward: float = 1.0) -> Behaviour:
    async def b(request: web.Request) -> web.StreamResponse:
        return web.json_response({"reward": reward, "info": {"judge": "scripted"}})
    return b


def status(code: int, headers: dict[str, str] | None = None) -> Behaviour:
    async def b(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, text=f"scripted {code}", headers=headers)
    return b


def raw_body(body: bytes) -> Behaviour:
    async def b(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")
    return b


def slow(delay_s: float) -> Behaviour:
    async def b(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_s)
        return web.json_response({"reward": 1.0})
    return b


async def drop(request: web.Request) -> web.StreamResponse:
    request.transport.close()  # the connection dies with no response sent
    return web.Response()  # aiohttp skips writing to the closed transport


async def endless_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()  # no Content-Length: the cap must be enforced while reading
    await response.prepare(request)
    try:
        await response.write(b'{"reward": 1.0, "info": {"pad": "')
        for _ in range(10_000):  # up to 640 MiB if nobody stops reading
            await response.write(b"x" * 65536)
    except (ConnectionResetError, ConnectionError):
        pass
    return response


def episode(answer: Any = "42", completion: str = "so the answer is 42", task_id: str = "t0") -> Episode:
    messages = [{"role": "user", "content": "what is 6*7?"}, {"role": "assistant", "content": completion}]
    return Episode(task_id=task_id, group_id=3, messages=messages, info={"task": {"answer": answer}})


def config(url: str, **overrides: Any) -> VerifierConfig:
    fields: dict[str, Any] = dict(url=url, connect_timeout_s=1.0, read_timeout_s=2.0, write_timeout_s=1.0,
                                  pool_timeout_s=2.0, max_retries=2, backoff_base_s=0.01, backoff_max_s=0.05,
                                  max_concurrency=8)
    return VerifierConfig(**{**fields, **overrides})


def call(app: web.Application, ep: Episode | None = None, **overrides: Any):
    """Serve `app`, score one episode, return (result, stats)."""
    async def go():
        async with serve(app) as base:
            async with HttpVerifier(config(base + "/verify", **overrides)) as verifier:
                result = await verifier(ep or episode())
                return result, verifier.stats()
    return asyncio.run(go())


# --- failure modes -------------------------------------------------------------------------------

def test_slow_beyond_read_deadline_is_timeout():
    app, seen = scripted_app(slow(1.0))
    result, stats = call(app, read_timeout_s=0.2, max_retries=1)
    assert result.status == "timeout" and math.isnan(result.value)
    assert result.info["kind"] == "timeout_read" and result.info["attempts"] == 2
    assert len(seen) == 2 and stats.timeout == 1 and stats.retries == 1 and stats.ok == 0


def test_timeout_then_success_is_ok():
    app, seen = scripted_app(slow(1.0), ok(0.5))
    result, stats = call(app, read_timeout_s=0.2)
    assert result.status == "ok" and result.value == 0.5 and result.info["attempts"] == 2
    assert stats.attempt_failures == {"timeout_read": 1}


def test_500_then_success_retries_exactly_once():
    app, seen = scripted_app(status(500), ok(0.75))
    result, stats = call(app)
    assert result.status == "ok" and result.value == 0.75
    assert result.info["attempts"] == 2 and result.info["verifier"] == {"judge": "scripted"}
    assert len(seen) == 2 and stats.retries == 1 and stats.ok == 1 and stats.attempt_failures == {"http_500": 1}


def test_exhausted_5xx_is_error():
    app, seen = scripted_app(status(503))
    result, stats = call(app, max_retries=3)
    assert result.status == "error" and result.info["http_status"] == 503 and "503" in result.info["error"]
    assert result.info["attempts"] == 4 and len(seen) == 4 and stats.retries == 3 and stats.by_kind == {"http_503": 1}


def test_429_retry_after_is_honoured():
    app, seen = scripted_app(status(429, {"Retry-After": "1"}), ok())
    result, stats = call(app, backoff_max_s=5.0)
    assert result.status == "ok" and stats.retries == 1 and len(seen) == 2
    assert seen[1].t - seen[0].t >= 1.0 - 1e-3  # both timestamps taken by the server


def test_retry_after_is_capped_by_backoff_max():
    app, seen = scripted_app(status(429, {"Retry-After": "120"}), ok())
    result, _ = call(app, backoff_max_s=0.1)
    assert result.status == "ok" and seen[1].t - seen[0].t < 5.0


def test_400_is_error_without_retry():
    app, seen = scripted_app(status(400))
    result, stats = call(app, max_retries=3)
    assert result.status == "error" and result.info["http_status"] == 400
    assert "HTTP 400" in result.info["error"] and "scripted 400" in result.info["error"]
    assert len(seen) == 1 and result.info["attempts"] == 1 and stats.retries == 0 and stats.error == 1


def test_malformed_json_is_error():
    app, seen = scripted_app(raw_body(b'{"reward": 1.0,'))
    result, stats = call(app)
    assert result.status == "error" and result.info["kind"] == "bad_json" and "not JSON" in result.info["error"]
    assert len(seen) == 1 and stats.by_kind == {"bad_json": 1}


@pytest.mark.parametrize("body", [b'{"score": 1.0}', b'{"reward": "1.0"}', b'{"reward": true}',
                                  b'{"reward": NaN}', b'{"reward": Infinity}', b'{"reward": 1.0, "info": [1]}',
                                  b"[1.0]", b"1.0"])
def test_wrong_schema_is_error(body: bytes):
    app, seen = scripted_app(raw_body(body))
    result, _ = call(app)
    assert result.status == "error" and result.info["kind"] == "bad_schema", result.info
    assert "reward" in result.info["error"] and len(seen) == 1


def test_extra_response_keys_are_ignored_and_ints_accepted():
    result, _ = call(scripted_app(raw_body(b'{"reward": 1, "details": {"x": 2}}'))[0])
    assert result.status == "ok" and result.value == 1.0 and result.info["verifier"] == {}


def test_dropped_connection_is_retried_then_ok():
    app, seen = scripted_app(drop, ok())
    result, stats = call(app)
    assert result.status == "ok" and result.info["attempts"] == 2 and len(seen) == 2
    assert stats.attempt_failures == {"dropped": 1}


def test_always_dropped_connection_is_error():
    app, seen = scripted_app(drop)
    result, stats = call(app, max_retries=2)
    assert result.status == "error" and result.info["kind"] == "dropped" and result.info["attempts"] == 3
    assert len(seen) == 3 and stats.retries == 2


def test_oversized_body_with_content_length_is_error():
    big = json.dumps({"reward": 1.0, "info": {"pad": "x" * 10_000}}).encode()
    app, seen = scripted_app(raw_body(big))
    result, _ = call(app, max_response_bytes=1024)
    assert result.status == "error" and result.info["kind"] == "too_large" and len(seen) == 1


def test_endless_streamed_body_is_cut_at_the_cap():
    app, seen = scripted_app(endless_stream)
    result, stats = call(app, max_response_bytes=256 * 1024, read_timeout_s=5.0)
    assert result.status == "error" and result.info["kind"] == "too_large"
    assert "max_response_bytes=262144" in result.info["error"] and len(seen) == 1


def test_unreachable_port_is_error_with_retries_counted():
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        async with HttpVerifier(config(f"http://127.0.0.1:{port}/verify", max_retries=3)) as verifier:
            return await verifier(episode()), verifier.stats()
    result, stats = asyncio.run(go())
    assert result.status == "error" and result.info["kind"] == "connect" and result.info["attempts"] == 4
    assert stats.retries == 3 and stats.attempt_failures == {"connect": 4} and stats.error == 1


def test_idempotency_key_is_stable_across_retries_and_calls():
    app, seen = scripted_app(status(502), status(503), ok(), ok())
    ep, other = episode(), episode()

    async def go():
        async with serve(app) as base:
            async with HttpVerifier(config(base + "/verify", max_retries=3)) as verifier:
                first = await verifier(ep)
                await verifier(other)
                return first
    result = asyncio.run(go())
    assert result.status == "ok" and result.info["attempts"] == 3
    keys = [s.headers["Idempotency-Key"] for s in seen]
    assert keys[0] == keys[1] == keys[2] == ep.info["episode_key"] == episode_key(ep)
    assert all(s.body["episode_id"] == s.headers["Idempotency-Key"] for s in seen)
    assert keys[3] == other.info["episode_key"] != keys[0] and keys[0].startswith("t0:3:")


def test_request_body_shape():
    app, seen = scripted_app(ok())
    ep = episode(answer="7", completion="it is 7")
    call(app, ep)
    assert seen[0].body == {"episode_id": ep.info["episode_key"], "task": {"answer": "7"},
                            "messages": ep.messages, "completion": "it is 7"}


def test_concurrency_cap_holds():
    live = {"now": 0, "max": 0, "n": 0}

    async def tracked(request: web.Request) -> web.StreamResponse:
        live["now"] += 1
        live["n"] += 1
        live["max"] = max(live["max"], live["now"])
        try:
            await asyncio.sleep(0.02)
            return web.json_response({"reward": 1.0})
        finally:
            live["now"] -= 1

    app = web.Application()
    app.router.add_post("/verify", tracked)

    async def go():
        async with serve(app) as base:
            async with HttpVerifier(config(base + "/verify", max_concurrency=8)) as verifier:
                results = await asyncio.gather(*(verifier(episode(task_id=f"t{i}")) for i in range(200)))
                return results, verifier.stats()
    results, stats = asyncio.run(go())
    assert all(r.status == "ok" for r in results) and live["n"] == 200
    assert live["max"] <= 8 and stats.max_in_flight <= 8
    assert live["max"] == 8  # the cap is reached, not just respected by running serially
    assert stats.calls == stats.ok == 200 and stats.in_flight == 0


def test_auth_header_from_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AGENTRL_TEST_VERIFIER_TOKEN", "s3cret")
    app, seen = scripted_app(ok())
    result, _ = call(app, auth_env="AGENTRL_TEST_VERIFIER_TOKEN")
    assert result.status == "ok" and seen[0].headers["Authorization"] == "Bearer s3cret"
    assert "s3cret" not in repr(HttpVerifier(config("http://x/verify", auth_env="AGENTRL_TEST_VERIFIER_TOKEN")))


def test_auth_env_unset_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AGENTRL_TEST_MISSING_TOKEN", raising=False)
    with pytest.raises(ValueError, match="AGENTRL_TEST_MISSING_TOKEN.*unset"):
        HttpVerifier(config("http://127.0.0.1:1/verify", auth_env="AGENTRL_TEST_MISSING_TOKEN"))


def test_config_rejects_bad_values():
    with pytest.raises(ValueError):
        config("ftp://host/verify")
    with pytest.raises(ValueError):
        config("http://host/verify", max_concurrency=0)
    with pytest.raises(ValueError):
        VerifierConfig(url="http://host/verify", max_retry=3)  # typo of max_retries: unknown key


# --- the reference verifier ----------------------------------------------------------------------

def test_reference_verifier_scores_right_and_wrong_answers():
    async def go():
        async with serve(make_app()) as base:
            async with HttpVerifier(config(base + "/verify")) as verifier:
                right = await verifier(episode(answer="1,000", completion="total: 1000."))
                wrong = await verifier(episode(answer=42, completion="I think 41"))
                none = await verifier(episode(answer="42", completion="no idea"))
                bad = await verifier(Episode(task_id="x", group_id=0, messages=[], info={"task": {}}))
                again = await verifier(episode(answer=42, completion="42"))
            async with httpx.AsyncClient() as client:
                health = (await client.get(base + "/health")).json()
            return right, wrong, none, bad, again, health
    right, wrong, none, bad, again, health = asyncio.run(go())
    assert (right.status, right.value, right.info["verifier"]["predicted"]) == ("ok", 1.0, 1000.0)
    assert (wrong.status, wrong.value) == ("ok", 0.0) and (none.status, none.value) == ("ok", 0.0)
    assert bad.status == "error" and bad.info["http_status"] == 400 and "task.answer" in bad.info["error"]
    assert again.value == 1.0 and health == {"status": "ok"}


def test_reference_verifier_replays_a_retried_key():
    async def go():
        async with serve(make_app()) as base:
            async with HttpVerifier(config(base + "/verify")) as verifier:
                ep = episode()
                return await verifier(ep), await verifier(ep)
    first, second = asyncio.run(go())
    assert first.value == second.value == 1.0
    assert first.info["verifier"]["replayed"] is False and second.info["verifier"]["replayed"] is True


# --- rule rewards (the reference verifier's scoring) ---------------------------------------------

def test_rules():
    assert numeric_match("a 3, then -2.50", "-2.5") == 1.0 and numeric_match("1,2,3", 3) == 1.0
    assert numeric_match("x = 1e-3", 0.001) == 1.0 and numeric_match("7", "#### 7") == 1.0
    assert numeric_match("42.1", 42) == 0.0 and numeric_match("", 1) == 0.0
    with pytest.raises(ValueError):
        numeric_match("42", "forty-two")
    assert exact_match("  Paris \n", "Paris") == 1.0 and exact_match("paris", "Paris") == 0.0
    fmt = r"<think>.*?</think>\s*<answer>.*?</answer>"
    assert regex_format("<think>a\nb</think>\n<answer>4</answer>\n", fmt) == 1.0
    assert regex_format("<answer>4</answer>", fmt) == 0.0


def test_rule_reward_adapter():
    ep = episode(answer="42", completion="it is 42")
    ep.messages.append({"role": "user", "content": "sure?"})
    ep.messages.append({"role": "assistant", "content": [{"type": "text", "text": "yes, 43"}]})
    assert asyncio.run(rule_reward(ep, numeric_match)).value == 0.0  # the *last* assistant message
    assert asyncio.run(as_reward(exact_match)(episode(answer="x", completion="x"))).value == 1.0
    missing = asyncio.run(rule_reward(ep, numeric_match, answer_key="solution"))
    assert missing.status == "error" and "solution" in missing.info["error"]
    raised = asyncio.run(rule_reward(episode(answer="n/a"), numeric_match))
    assert raised.status == "error" and math.isnan(raised.value) and "ValueError" in raised.info["error"]


def test_cancelled_call_is_counted_and_propagates():
    app, seen = scripted_app(slow(1.0))

    async def go():
        async with serve(app) as base:
            async with HttpVerifier(config(base + "/verify")) as verifier:
                task = asyncio.ensure_future(verifier(episode()))
                while not seen:
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                return verifier.stats()
    stats = asyncio.run(go())
    assert stats.calls == stats.cancelled == 1 and stats.in_flight == 0 and stats.error == stats.timeout == 0
