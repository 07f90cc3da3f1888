"""The OpenAI endpoint's bounds on a real aiohttp server on loopback, against the scripted in-memory
engine: HTTP-opened sessions expire when idle (never while serving, never a training episode's), their
turn and token caps and the global session cap answer 400 / 429 naming the setting, a generation past
its deadline is a 504, a client that disconnects cancels its generation (streamed or not) and leaves
the ledger as it was, and a 5xx body names an error id, never the exception. Also the reference
verifier's and tool server's 400s for malformed bodies, and the OpenEnv adapter's bounded restarts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
import pytest
from pydantic import SecretStr

from agentrl.data.chat import ChatFormat
from agentrl.config import ServerConfig
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import get_tool_format
from agentrl.types import Episode
from rewards.servers import serve
from rewards.servers import tools as tool_server
from rewards.servers import verifier
from tests.fake_engine import ScriptedEngine

QUESTION = {"role": "user", "content": "What is 2 + 2?"}


def server_config(**fields: Any) -> ServerConfig:
    """A ServerConfig with `fields`; those this checkout's ServerConfig does not declare yet are set
    unvalidated (the server reads them with defaults)."""
    known = {k: v for k, v in fields.items() if k in ServerConfig.model_fields and k != "api_key"}
    extra = {k: v for k, v in fields.items() if k not in known}
    cfg = ServerConfig(**known)
    return cfg.model_copy(update=extra) if extra else cfg


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class BlockingEngine(ScriptedEngine):
    """Replies "done." but, while `block` is set, each generation waits for `release`; counts the
    generations cancelled while waiting (what aborts the request in vLLM)."""

    def __init__(self, tokenizer, block: bool = True) -> None:
        super().__init__(tokenizer, lambda prompt, i: "done.")
        self.block, self.started, self.release = block, asyncio.Event(), asyncio.Event()
        self.cancelled = 0

    async def generate(self, *args, **kwargs):
        if self.block:
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().generate(*args, **kwargs)


@asynccontextmanager
async def served(tokenizer, engine=None, limits: Limits | None = None, **cfg):
    engine = engine or ScriptedEngine(tokenizer, lambda prompt, i: "done.")
    srv = OpenAIServer(ChatFormat(tokenizer), server_config(**cfg), get_tool_format("hermes"),
                       limits or Limits(512, 16, 100), engine=engine)
    await srv.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield srv, engine, http
    finally:
        await srv.stop()


async def post(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, Any]:
    async with http.post(url, json=body) as reply:
        return reply.status, await reply.json(content_type=None)


async def open_http_session(srv, http) -> tuple[str, str]:
    status, body = await post(http, f"{srv.url}/sessions", {})
    assert status == 200, body
    return body["id"], body["base_url"]


def test_an_idle_http_session_expires_and_a_busy_or_training_one_does_not(tiny_tokenizer):
    async def run():
        engine = BlockingEngine(tiny_tokenizer, block=False)
        async with served(tiny_tokenizer, engine, session_idle_timeout_s=0.2) as (srv, _, http):
            sid, base = await open_http_session(srv, http)
            ok = await post(http, f"{base}/chat/completions", {"messages": [QUESTION]})
            training = srv.open_session(engine, Episode("t", 0))
            while sid in srv.sessions:  # the periodic sweep, every 0.05 s here
                await asyncio.sleep(0.05)
            async with http.get(f"{srv.url}/sessions/{sid}") as gone:
                gone = (gone.status, await gone.json())
            expired = srv.stats()["ledger/sessions_expired"]
            engine.block = True  # a session serving a request is not idle, however long ago it began
            _, base2 = await open_http_session(srv, http)
            pending = asyncio.create_task(post(http, f"{base2}/chat/completions", {"messages": [QUESTION]}))
            await engine.started.wait()
            swept_busy = srv.sweep(now=float("inf"))
            engine.release.set()
            return ok, gone, expired, training.sid in srv.sessions, swept_busy, await pending

    ok, gone, expired, training_kept, swept_busy, second = asyncio.run(run())
    assert ok[0] == 200 and ok[1]["choices"][0]["message"]["content"] == "done."
    assert gone[0] == 404 and gone[1]["error"]["code"] == "session_not_found"
    assert "expired after 0.2 s idle" in gone[1]["error"]["message"] and expired == 1
    assert training_kept and swept_busy == 0 and second[0] == 200


def test_per_session_turn_and_token_caps_are_a_400_naming_the_setting(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, session_max_turns=2, session_max_tokens=10_000) as (srv, _, http):
            _, base = await open_http_session(srv, http)
            messages, turns = [QUESTION], []
            for _ in range(3):
                status, body = await post(http, f"{base}/chat/completions", {"messages": messages})
                turns.append((status, body))
                if status == 200:
                    messages = messages + [body["choices"][0]["message"], {"role": "user", "content": "And?"}]
        async with served(tiny_tokenizer, session_max_tokens=64) as (srv, _, http):
            sid, base = await open_http_session(srv, http)
            tokens = []
            for i in range(8):  # every request a new conversation: the ledger splits, each segment kept
                status, body = await post(http, f"{base}/chat/completions",
                                          {"messages": [{"role": "user", "content": f"Question {i}?"}]})
                ep = srv.sessions[sid].ep
                tokens.append((status, body, len(ep.tokens) + sum(len(s.tokens) for s in ep.segments)))
        return turns, tokens

    turns, tokens = asyncio.run(run())
    assert [s for s, _ in turns] == [200, 200, 400]
    refused = turns[2][1]["error"]
    assert refused["code"] == "context_length_exceeded" and "2 model turns" in refused["message"]
    statuses = [s for s, _, _ in tokens]
    assert statuses[0] == 200 and 400 in statuses and all(n <= 64 for _, _, n in tokens)
    refused = next(b for s, b, _ in tokens if s == 400)["error"]
    assert refused["code"] == "context_length_exceeded" and "server.session_max_tokens" in refused["message"]


def test_the_global_session_cap_is_a_429_and_closing_one_makes_room(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, max_sessions=3) as (srv, _, http):
            ids = [(await open_http_session(srv, http))[0] for _ in range(3)]
            refused = await post(http, f"{srv.url}/sessions", {})
            async with http.delete(f"{srv.url}/sessions/{ids[0]}") as closed:
                closed_status = closed.status
            again = await post(http, f"{srv.url}/sessions", {})
            return refused, closed_status, again, len(srv.sessions)

    refused, closed, again, n = asyncio.run(run())
    assert refused[0] == 429 and refused[1]["error"]["code"] == "too_many_sessions"
    assert "server.max_sessions" in refused[1]["error"]["message"]
    assert closed == 200 and again[0] == 200 and n == 3


def test_a_generation_past_its_deadline_is_a_504_and_the_ledger_is_untouched(tiny_tokenizer):
    async def run():
        engine = BlockingEngine(tiny_tokenizer)
        # Limits without a timeout (agentrl.serve's): the server's generation_timeout_s applies
        async with served(tiny_tokenizer, engine, generation_timeout_s=0.2) as (srv, _, http):
            sid, base = await open_http_session(srv, http)
            late = await post(http, f"{base}/chat/completions", {"messages": [QUESTION]})
            held = len(srv.sessions[sid].ep.tokens)
            engine.block = False
            ok = await post(http, f"{base}/chat/completions", {"messages": [QUESTION]})
            return late, held, engine.cancelled, ok, srv.limits.timeout_s

    late, held, cancelled, ok, timeout = asyncio.run(run())
    assert late[0] == 504 and late[1]["error"]["code"] == "timeout" and "0.2 s" in late[1]["error"]["message"]
    assert held == 0 and cancelled == 1 and ok[0] == 200 and timeout == 0.2


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_generation(tiny_tokenizer, stream):
    async def run():
        engine = BlockingEngine(tiny_tokenizer)
        async with served(tiny_tokenizer, engine) as (srv, _, http):
            sid, base = await open_http_session(srv, http)
            async with aiohttp.ClientSession() as leaving:
                request = asyncio.create_task(leaving.post(f"{base}/chat/completions",
                                                           json={"messages": [QUESTION], "stream": stream}))
                await engine.started.wait()
                request.cancel()  # the client gives up: its connection closes
                await asyncio.gather(request, return_exceptions=True)
            for _ in range(200):  # the server notices the closed connection on its next loop passes
                if engine.cancelled:
                    break
                await asyncio.sleep(0.05)
            ledger = list(srv.sessions[sid].ep.tokens)
            engine.block = False
            after = await post(http, f"{base}/chat/completions", {"messages": [QUESTION]})
            return engine.cancelled, ledger, after, srv.sessions[sid].engine_error

    cancelled, ledger, after, engine_error = asyncio.run(run())
    assert cancelled == 1 and ledger == [] and engine_error is None
    assert after[0] == 200 and after[1]["choices"][0]["message"]["content"] == "done."


def test_an_engine_failure_is_a_500_naming_an_error_id_that_the_log_holds(tiny_tokenizer, caplog):
    def script(prompt, index):
        raise RuntimeError("EngineDeadError: core died at /secret/path.py")

    async def run():
        engine = ScriptedEngine(tiny_tokenizer, script)
        async with served(tiny_tokenizer, engine) as (srv, _, http):
            _, base = await open_http_session(srv, http)
            plain = await post(http, f"{base}/chat/completions", {"messages": [QUESTION]})
            async with http.post(f"{base}/chat/completions", json={"messages": [QUESTION], "stream": True}) as r:
                streamed = (r.status, await r.text())
            return plain, streamed

    with caplog.at_level(logging.ERROR):
        plain, streamed = asyncio.run(run())
    error = plain[1]["error"]
    assert plain[0] == 500 and error["code"] == "engine_error" and error["type"] == "server_error"
    assert "core died" not in json.dumps(plain[1]) and "RuntimeError" not in json.dumps(plain[1])
    eid = error["message"].split("error id ")[1].split(";")[0]
    logged = [r for r in caplog.records if eid in r.getMessage()]
    assert logged and "core died" in logged[0].getMessage() and logged[0].exc_info is not None
    assert streamed[0] == 500 and "core died" not in streamed[1] and "error id" in streamed[1]


def test_a_secret_api_key_is_checked_as_its_plain_text(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, api_key=SecretStr("s3cret")) as (srv, _, http):
            url = f"{srv.url}/v1/chat/completions"
            async with http.post(url, json={"messages": [QUESTION]}) as none:
                no_key = none.status
            async with http.post(url, json={"messages": [QUESTION]},
                                 headers={"Authorization": "Bearer s3cret"}) as ok:
                return no_key, ok.status

    assert asyncio.run(run()) == (401, 200)


# ---------------------------------------------------------------- the reference verifier and tool server

MALFORMED_MESSAGES = ["the answer is 4", [1, 2], [{"content": "4"}], [{"role": "assistant", "content": 4}],
                      [{"role": "assistant", "content": [{"type": "text", "text": 4}]}], {"role": "assistant"}]


@pytest.mark.parametrize("messages", MALFORMED_MESSAGES)
def test_the_verifier_answers_malformed_messages_with_a_400_that_is_not_retried(messages):
    from agentrl.config import VerifierConfig
    from rewards.http_verifier import HttpVerifier

    async def run():
        async with serve(verifier.make_app()) as url:
            async with HttpVerifier(VerifierConfig(url=f"{url}/verify", max_retries=3)) as client:
                body = json.dumps({"task": {"answer": 4}, "messages": messages, "completion": "4"}).encode()
                return await client.request("POST", f"{url}/verify", lambda raw: raw, body=body)

    failure, attempts = asyncio.run(run())
    assert failure.http_status == 400 and not failure.retryable and attempts == 1
    assert "messages" in failure.message


@pytest.mark.parametrize("body", [b'{"task": {"answer": 4}, "completion": "4"' + b"]" * 0, b"[" * 5000 + b"]" * 5000,
                                  b'{"task": {"answer": ' + b"9" * 5000 + b"}}", b'{"task": {"answer": NaN}}',
                                  b'{"task": {"answer": 1e999}, "completion": "4"}',
                                  b'{"task": {"answer": ' + b"1" + b"0" * 400 + b"}, \"completion\": \"4\"}"])
def test_the_verifier_and_tool_server_answer_unusable_json_with_a_400(body):
    async def run():
        async with serve(verifier.make_app()) as v, serve(tool_server.make_app()) as t:
            async with httpx.AsyncClient() as http:
                typed = {"Content-Type": "application/json"}  # an untyped body is a 415 (agentrl.utils.local_only)
                return (await http.post(f"{v}/verify", content=body, headers=typed),
                        await http.post(f"{t}/call", content=body, headers=typed))

    for reply in asyncio.run(run()):
        assert reply.status_code == 400 and "error" in reply.json() and "Traceback" not in reply.text


# ---------------------------------------------------------------- the OpenEnv adapter's restarts


def test_restart_backoff_doubles_up_to_its_cap():
    from envs.openenv_server import Restarts

    assert [Restarts(backoff_s=1.0).delay_s(n) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]


def test_a_dying_openenv_app_is_restarted_a_bounded_number_of_times_then_fails_the_episode(
        tiny_tokenizer, monkeypatch, tmp_path):
    """Each "server" is a real process that has already exited, as an app that crashes at once."""
    import subprocess
    import sys

    from agentrl.config import RolloutConfig
    from agentrl.rollout.episode import EpisodeSpec, run_episode
    from envs import openenv_server
    from envs.openenv_env import OpenEnvEnv, OpenEnvError
    from tests.fake_engine import ScriptedEngine as Engine

    app, launched = "tests.fixtures.crashing:app", []

    def launch(name: str, start_timeout_s: float = 60.0, attempts: int = 3):
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        proc.wait()
        log = tmp_path / f"server-{len(launched)}.log"
        log.write_text("boom: the app crashed\n")
        launched.append(proc.pid)
        return openenv_server.LocalServer(name, "http://127.0.0.1:9", proc, log)

    monkeypatch.setattr(openenv_server, "launch", launch)
    kwargs = {"app": app, "max_restarts": 2, "restart_backoff_s": 0.01, "timeout_s": 1.0, "connect_timeout_s": 1.0}
    spec = EpisodeSpec(OpenEnvEnv, kwargs, ChatFormat(tiny_tokenizer), RolloutConfig(max_turns=2), 512)

    async def main():
        errors = []
        for _ in range(5):  # the first start, two restarts, then refusals
            env = OpenEnvEnv(**kwargs)
            with pytest.raises(OpenEnvError) as failed:  # a dead server's port refuses, or no restart
                await env.reset({"id": "t", "seed": 1})
            await env.close()
            errors.append(str(failed.value))
        ep = await run_episode({"id": "t", "seed": 1}, Engine(tiny_tokenizer, ["1"]), spec)
        return errors, ep

    try:
        errors, ep = asyncio.run(main())
    finally:
        with openenv_server._LOCK:
            openenv_server._SERVERS.pop(app, None)
            openenv_server._FAILURES.pop(app, None)
    assert len(launched) == 3  # the first start and max_restarts=2 restarts, no more
    refused = [e for e in errors if "not starting it again" in e]
    assert len(refused) == 2 and "3 times" in refused[0] and "env.kwargs.max_restarts" in refused[0]
    assert "exited with code 3" in refused[0] and "boom: the app crashed" in refused[0]
    assert ep.status == "env_error" and "not starting it again" in ep.error
