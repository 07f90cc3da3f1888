"""Tool calling: the parser registry, the remote tool client against real aiohttp servers on loopback
(the reference server and ones that misbehave on purpose), result truncation to a token budget, and
CalculatorEnv played by a scripted engine against the reference tool server, with the pool's tool counters.

Each test runs its own event loop (asyncio.run) and its own servers on ephemeral ports.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
from collections import Counter
from typing import Any, Awaitable, Callable

import httpx
import pytest
from aiohttp import web
from fake_engine import ScriptedEngine
from pydantic import ValidationError

from agentrl.data.chat import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.env import Action, Env, StepResult
from agentrl.rollout.tools.budget import truncate_to_tokens
from agentrl.rollout.tools.client import RemoteToolClient, RemoteToolError, ToolResult, aclose_shared
from agentrl.rollout.episode import EpisodeSpec, run_episode
from agentrl.rollout.pool import RolloutPool
from agentrl.rollout.tools.counts import ToolCallStats
from agentrl.rollout.tools import TOOL_FORMATS, ToolCall, get_tool_parser, register_tool_parser
from envs.calculator import CalculatorEnv
from rewards.servers import serve
from rewards.servers.tools import TOOL_SPECS, make_app

Behaviour = Callable[[web.Request], Awaitable[web.StreamResponse]]
hermes = TOOL_FORMATS["hermes"].parse


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


# ---------------------------------------------------------------- parsers


def test_hermes_parses_single_parallel_and_string_arguments():
    assert hermes("I'll compute.\n" + tool_call("calculator", expression="2 * 3")) == \
        ([ToolCall("calculator", {"expression": "2 * 3"})], None)
    text = tool_call("a", x=1) + "\n" + '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>'
    assert hermes(text) == ([ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2]})], None)
    assert hermes("42") == ([], None)


@pytest.mark.parametrize("text, calls, error", [
    ('<tool_call>{"name": "a", </tool_call>', [], "malformed tool call '{\"name\": \"a\",'"),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>nope</tool_call>', [ToolCall("a", {})],
     "malformed tool call 'nope'"),
    ('<tool_call>{"name": "a", "arguments": {"x": 1}}', [], "unterminated <tool_call>"),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name"', [ToolCall("a", {})],
     "unterminated <tool_call>"),
])
def test_hermes_malformed_and_unterminated_are_errors_not_exceptions(text, calls, error):
    got_calls, got_error = hermes(text)
    assert got_calls == calls
    assert got_error.startswith(error)


def test_none_parser_and_lookup_errors():
    assert get_tool_parser("none")(tool_call("a")) == ([], None)
    assert get_tool_parser("agentrl.rollout.tools:hermes") is hermes  # module:name imports the module first
    with pytest.raises(ValueError, match=r"rollout.tool_format='qwen9' is not one of \['hermes', 'mistral', 'none'"):
        get_tool_parser("qwen9")
    with pytest.raises(ValueError, match="rollout.tool_format='no_such_mod:x': cannot import 'no_such_mod'"):
        get_tool_parser("no_such_mod:x")
    with pytest.raises(ValueError, match="already registered"):
        register_tool_parser("hermes", render=lambda calls: "", start_marker=None)(hermes)
    with pytest.raises(ValidationError, match="rollout.tool_format='qwen9' is not one of"):
        RolloutConfig(tool_format="qwen9")


@pytest.fixture
def bracket_parser():
    """A custom format, `CALL name(json)`, registered for one test."""

    @register_tool_parser("test_bracket", render=lambda calls: "", start_marker="CALL ")
    def parse(text: str) -> tuple[list[ToolCall], str | None]:
        if not text.startswith("CALL "):
            return [], None
        name, _, rest = text[5:].partition("(")
        try:
            return [ToolCall(name, json.loads(rest.rstrip(")")))], None
        except json.JSONDecodeError as exc:
            return [], f"bad CALL: {exc}"

    yield "test_bracket"
    del TOOL_FORMATS["test_bracket"]


class RecordingEnv(Env):
    def __init__(self) -> None:
        self.actions: list[Action] = []
        RecordingEnv.last = self

    async def reset(self, task):
        return "go"

    async def step(self, action: Action) -> StepResult:
        self.actions.append(action)
        done = not action.tool_calls and action.tool_parse_error is None
        return StepResult(None if done else [{"role": "tool", "content": "ok"}], 0.0, done)


def test_rollout_uses_the_configured_parser_and_counts_per_episode(tiny_tokenizer, bracket_parser):
    script = ['CALL add({"a": 2})', "CALL add({oops)", tool_call("add", a=1)]  # the last is plain text here
    spec = EpisodeSpec(RecordingEnv, {}, ChatFormat(tiny_tokenizer),
                       RolloutConfig(tool_format=bracket_parser, max_tokens_per_turn=128), 1024)
    ep = asyncio.run(run_episode({"id": "p"}, ScriptedEngine(tiny_tokenizer, script), spec))
    acts = RecordingEnv.last.actions
    assert [a.tool_calls for a in acts] == [[ToolCall("add", {"a": 2})], [], []]
    assert acts[1].tool_parse_error.startswith("bad CALL") and acts[2].tool_parse_error is None  # hermes text
    assert (ep.info["tool_calls"], ep.info["tool_parse_errors"], ep.info["tool_call_turns"]) == (1, 1, 2)


# ---------------------------------------------------------------- remote client: reference server


def client(url: str, **overrides: Any) -> RemoteToolClient:
    fields: dict[str, Any] = dict(connect_timeout_s=1.0, read_timeout_s=2.0, write_timeout_s=1.0, pool_timeout_s=2.0,
                                  max_retries=2, backoff_base_s=0.01, backoff_max_s=0.05, max_concurrency=8)
    return RemoteToolClient(url, **{**fields, **overrides})


def test_reference_server_lists_and_runs_tools():
    async def go():
        async with serve(make_app()) as base:
            async with client(base + "/") as c:  # a trailing slash is fine
                specs = await c.list_tools()
                results = [await c.call("calculator", {"expression": e}) for e in ("37 * 89", "(1 + 2) / 4", "1/0",
                                                                                  "2 ** 8", "__import__('os')")]
                results.append(await c.call("lookup", {"key": "seconds_per_day"}))
                results.append(await c.call("calculator", {"expr": "1"}))
                unknown = await c.call("shell", {"cmd": "ls"})
                stats = c.stats()
            async with httpx.AsyncClient() as http:
                server = (await http.get(base + "/stats")).json()
            return specs, results, unknown, stats, server

    specs, results, unknown, stats, server = asyncio.run(go())
    assert specs == TOOL_SPECS
    assert [(r.status, r.content, r.info["is_error"]) for r in results] == [
        ("ok", "3293", False), ("ok", "0.75", False), ("ok", "error: division by zero", True),
        ("ok", "error: unsupported syntax Pow: only numbers, + - * / and parentheses", True),
        ("ok", "error: unsupported syntax Call: only numbers, + - * / and parentheses", True),
        ("ok", "86400", False), ("ok", "error: argument 'expression' must be a string, got null", True)]
    assert (unknown.status, unknown.content, unknown.info["http_status"], unknown.info["attempts"]) == \
        ("error", "", 404, 1)
    assert "unknown tool 'shell'" in unknown.info["error"] and unknown.info["tool"] == "shell"
    assert (stats.calls, stats.ok, stats.error, stats.retries) == (9, 8, 1, 0)
    assert server == {"calls": {"calculator": 6, "lookup": 1}, "listed": 1}


# ---------------------------------------------------------------- remote client: misbehaving servers


def scripted_app(*behaviours: Behaviour, tools: Any = None) -> tuple[web.Application, list[dict[str, Any]]]:
    """POST /call gets behaviours[n] on its n-th request (the last repeats); GET /tools returns `tools`."""
    seen: list[dict[str, Any]] = []

    async def call(request: web.Request) -> web.StreamResponse:
        seen.append({"headers": dict(request.headers), "body": json.loads(await request.read())})
        return await behaviours[min(len(seen), len(behaviours)) - 1](request)

    async def list_tools(request: web.Request) -> web.StreamResponse:
        return web.json_response({"tools": TOOL_SPECS} if tools is None else tools)

    app = web.Application()
    app.router.add_post("/call", call)
    app.router.add_get("/tools", list_tools)
    return app, seen


def ok(content: str = "3") -> Behaviour:
    async def b(request):
        return web.json_response({"content": content})
    return b


def status(code: int) -> Behaviour:
    async def b(request):
        return web.Response(status=code, text=f"scripted {code}")
    return b


def raw(body: bytes) -> Behaviour:
    async def b(request):
        return web.Response(body=body, content_type="application/json")
    return b


def slow(delay_s: float) -> Behaviour:
    async def b(request):
        await asyncio.sleep(delay_s)
        return web.json_response({"content": "late"})
    return b


def call_once(app: web.Application, **overrides: Any) -> tuple[ToolResult, Any]:
    async def go():
        async with serve(app) as base, client(base, **overrides) as c:
            return await c.call("calculator", {"expression": "1 + 2"}, key="ep1:0:0"), c.stats()
    return asyncio.run(go())


def test_slow_beyond_deadline_is_timeout():
    app, seen = scripted_app(slow(1.0))
    result, stats = call_once(app, read_timeout_s=0.2, max_retries=1)
    assert (result.status, result.content, result.info["kind"], result.info["attempts"]) == \
        ("timeout", "", "timeout_read", 2)
    assert len(seen) == 2 and stats.timeout == 1 and not result.ok


def test_500_then_success_retries_once_with_the_same_key():
    app, seen = scripted_app(status(500), ok("3"))
    result, stats = call_once(app)
    assert (result.status, result.content, result.info["attempts"]) == ("ok", "3", 2)
    assert stats.retries == 1 and stats.attempt_failures == {"http_500": 1}
    assert [s["headers"]["Idempotency-Key"] for s in seen] == ["ep1:0:0", "ep1:0:0"]
    assert seen[0]["body"] == {"name": "calculator", "arguments": {"expression": "1 + 2"}}


def test_400_is_not_retried():
    app, seen = scripted_app(status(400))
    result, stats = call_once(app, max_retries=3)
    assert (result.status, result.info["http_status"], result.info["attempts"], len(seen)) == ("error", 400, 1, 1)
    assert "scripted 400" in result.info["error"] and stats.retries == 0


@pytest.mark.parametrize("body, kind", [
    (b'{"content": "3"', "bad_json"),
    (b'{"content": 3}', "bad_schema"),
    (b'{"result": "3"}', "bad_schema"),
    (b'{"content": "3", "is_error": "no"}', "bad_schema"),
    (b'["3"]', "bad_schema"),
])
def test_malformed_or_wrong_schema_reply_is_error(body, kind):
    app, seen = scripted_app(raw(body))
    result, _ = call_once(app)
    assert (result.status, result.info["kind"], len(seen)) == ("error", kind, 1), result.info


def test_oversized_body_is_error():
    app, seen = scripted_app(raw(json.dumps({"content": "x" * 10_000}).encode()))
    result, _ = call_once(app, max_response_bytes=1024)
    assert (result.status, result.info["kind"], len(seen)) == ("error", "too_large", 1)


@pytest.mark.parametrize("tools, fragment", [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ([{"name": "calculator"}], "breaks the schema"),
    ({"tools": TOOL_SPECS + TOOL_SPECS[:1]}, "duplicate tool names"),
])
def test_bad_tool_listing_raises(tools, fragment):
    app, _ = scripted_app(ok(), tools=tools)

    async def go():
        async with serve(app) as base, client(base) as c:
            await c.list_tools()

    with pytest.raises(RemoteToolError, match="tool") as err:
        asyncio.run(go())
    assert fragment in str(err.value)


# ---------------------------------------------------------------- truncation


def test_truncate_to_token_budget(tiny_tokenizer):
    tok = tiny_tokenizer
    n_tokens = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    text = "the result of the long computation is " + "1234567890" * 20
    assert truncate_to_tokens("3293", tok, 32) == "3293"
    marker = " …[truncated]"
    assert n_tokens(text) > 64 and 4 < n_tokens(marker) < 16
    for budget in (16, 17, 32, 64):
        out = truncate_to_tokens(text, tok, budget)
        assert budget - 2 <= n_tokens(out) <= budget and out.endswith(marker)
        assert text.startswith(out[: -len(marker)])
    for budget in (1, 3, 4):  # no room for the marker: a plain cut
        short = truncate_to_tokens(text, tok, budget)
        assert n_tokens(short) == budget and text.startswith(short)
    assert truncate_to_tokens(text, tok, 0) == ""
    assert truncate_to_tokens("héllo wörld", None, 9) == "héllo w"  # UTF-8 bytes; half an "ö" is dropped


# ---------------------------------------------------------------- CalculatorEnv through rollout

TASK = {"id": "c0", "a": 37, "b": 89, "op": "*", "answer": 3293}
CALL = tool_call("calculator", expression="37 * 89")


def calc_spec(tok, url: str, **env: Any) -> EpisodeSpec:
    kwargs = {"tool_url": url, "tokenizer": tok, "client": {"max_retries": 1, "backoff_base_s": 0.01,
                                                            "backoff_max_s": 0.02, "read_timeout_s": 2.0}, **env}
    return EpisodeSpec(CalculatorEnv, kwargs, ChatFormat(tok), RolloutConfig(max_tokens_per_turn=400,
                                                                             turn_timeout_s=5), 2048)


def play(tok, script, app: web.Application | None = None, url: str | None = None, **env: Any):
    """One CalculatorEnv episode against `app` (or a bare `url`); returns (episode, the reference server's
    /stats, or None for other servers)."""
    async def go():
        try:
            if app is None:
                return await run_episode(TASK, ScriptedEngine(tok, script), calc_spec(tok, url, **env)), None
            async with serve(app) as base:
                ep = await run_episode(TASK, ScriptedEngine(tok, script), calc_spec(tok, base, **env))
                async with httpx.AsyncClient() as http:
                    stats = await http.get(base + "/stats")
                return ep, stats.json() if stats.status_code == 200 else None
        finally:
            await aclose_shared()
    return asyncio.run(asyncio.wait_for(go(), 20))


def test_correct_tool_call_then_answer_succeeds(tiny_tokenizer):
    tok = tiny_tokenizer
    ep, server = play(tok, [CALL, "3293"], make_app())
    assert (ep.status, ep.error, ep.reward, ep.success) == ("ok", "", 1.0, True)
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert ep.messages[3] == {"role": "tool", "content": "3293", "name": "calculator"}
    # the tool reply enters the ledger as the template's suffix only, with loss mask 0
    turn = ep.turns[0]
    env_start = turn.start + turn.n_generated
    assert tok.decode(ep.tokens[env_start:env_start + turn.env_tokens]) == \
        "\n<|im_start|>tool\n3293<|im_end|>\n<|im_start|>assistant\n"
    assert set(ep.loss_mask[env_start:env_start + turn.env_tokens]) == {0}
    assert (ep.info["tool_calls"], ep.info["tool_parse_errors"]) == (1, 0)
    assert server == {"calls": {"calculator": 1}, "listed": 1}


def test_malformed_call_gets_an_error_observation_and_the_episode_continues(tiny_tokenizer):
    bad = '<tool_call>{"name": "calculator", "arguments": </tool_call>'
    ep, server = play(tiny_tokenizer, [bad, CALL, "3293"], make_app())
    assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True)
    error = ep.messages[3]
    assert error["role"] == "tool" and error["content"].startswith("error: malformed tool call")
    assert (ep.info["tool_calls"], ep.info["tool_parse_errors"], ep.info["tool_call_turns"]) == (1, 1, 2)
    assert server["calls"] == {"calculator": 1}


def test_parallel_calls_unknown_tool_truncation_and_wrong_answer(tiny_tokenizer):
    tok = tiny_tokenizer
    turn1 = tool_call("calculator", expression="1 / 3") + tool_call("shell", cmd="ls") + tool_call("lookup", key="pi")
    ep, server = play(tok, [turn1, "about 3000"], make_app(), result_token_budget=4)
    assert (ep.status, ep.reward, ep.success) == ("ok", 0.0, False)
    tool_msgs = ep.messages[3:6]
    assert [m["name"] for m in tool_msgs] == ["calculator", "shell", "lookup"]
    assert tool_msgs[0]["content"] == truncate_to_tokens("0.333333333333", tok, 4) != "0.333333333333"
    assert tool_msgs[1]["content"] == "error: unknown tool 'shell'; tools: ['calculator', 'lookup']"
    assert tool_msgs[2]["content"] == truncate_to_tokens("3.14159265358979", tok, 4)
    assert server["calls"] == {"calculator": 1, "lookup": 1}  # the unknown tool never reached the server


def test_tool_server_down_is_env_error_not_reward_zero(tiny_tokenizer):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ep, _ = play(tiny_tokenizer, [CALL, "3293"], url=f"http://127.0.0.1:{port}")
    assert ep.status == "env_error" and not ep.trainable
    assert ep.error.startswith("agentrl.rollout.tools.client.RemoteToolError: tool discovery at")
    assert "connect" in ep.error.lower()


def test_tool_call_failure_mid_episode_is_env_error_naming_the_tool(tiny_tokenizer):
    app, seen = scripted_app(status(503))
    ep, _ = play(tiny_tokenizer, [CALL, "3293"], app)
    assert ep.status == "env_error" and not ep.trainable and ep.n_generated > 0
    assert "tool 'calculator'" in ep.error and "http_503" in ep.error and "2 attempt(s)" in ep.error
    assert len(seen) == 2  # one retry, then the episode ends


def test_pool_tool_metrics_are_counted_exactly(tiny_tokenizer):
    tok = tiny_tokenizer
    bad = '<tool_call>{"name": "calculator"'  # unterminated
    plans = {  # by first operand: the assistant turns of that episode
        37: [CALL, "3293"],  # 2 turns, 1 call
        38: ["3000"],  # 1 turn, no call, wrong
        39: [bad, CALL + tool_call("lookup", key="pi"), "3471"],  # 3 turns, 2 calls, 1 parse error
    }

    def script(prompt_ids: list[int], index: int) -> str:
        text = tok.decode(prompt_ids)
        a = int(text.split("What is ")[1].split(" ")[0])
        return plans[a][text.count("<|im_start|>assistant") - 1]

    async def go():
        try:
            async with serve(make_app()) as base:
                pool = RolloutPool(ScriptedEngine(tok, script), calc_spec(tok, base))
                groups = await asyncio.gather(*(pool.group({**TASK, "id": f"t{a}", "a": a, "answer": a * 89}, a, 2)
                                                for a in plans))
                async with httpx.AsyncClient() as http:
                    server = (await http.get(base + "/stats")).json()
                return pool, groups, server
        finally:
            await aclose_shared()

    pool, groups, server = asyncio.run(go())
    assert pool.status_counts == Counter({"ok": 6})
    assert [e.reward for g in groups for e in g.episodes] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    s = pool.tool_stats
    assert (s.episodes, s.turns, s.tool_calls, s.tool_parse_errors, s.tool_call_turns,
            s.episodes_without_tool_call) == (6, 12, 6, 2, 6, 2)
    m = s.metrics()
    assert (m["tools/calls_per_turn"], m["tools/parse_failure_rate"], m["tools/no_call_episode_frac"]) == \
        (0.5, 2 / 6, 2 / 6)
    assert server == {"calls": {"calculator": 4, "lookup": 2}, "listed": 1}  # specs discovered once per URL
    s.clear()
    assert s == ToolCallStats() and math.isnan(s.metrics()["tools/calls_per_turn"])


def test_make_tasks_are_deterministic_and_split_apart():
    train = CalculatorEnv.make_tasks(50, 0, "train")
    assert train == CalculatorEnv.make_tasks(50, 0, "train") != CalculatorEnv.make_tasks(50, 0, "eval")
    for t in train:
        assert 12 <= t["a"] <= 999 and 12 <= t["b"] <= 999
        assert t["answer"] == {"+": t["a"] + t["b"], "-": t["a"] - t["b"], "*": t["a"] * t["b"]}[t["op"]]


def test_reference_server_runs_as_a_module():
    proc = subprocess.Popen([sys.executable, "-m", "rewards.servers.tools", "--port", "0"], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("tool server listening on http://127.0.0.1:")
        url = line.split()[-1]
        assert httpx.get(url + "/health", timeout=5).json() == {"status": "ok"}
        assert [t["function"]["name"] for t in httpx.get(url + "/tools", timeout=5).json()["tools"]] == \
            ["calculator", "lookup"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


# -- tool servers in the config tree ------------------------------------------------------------------

def test_a_named_tool_server_comes_from_the_config_tree(tiny_tokenizer):
    """`tools.servers.<name>` carries the URL and client settings; CalculatorEnv(tool_server=<name>) plays
    against that server on loopback with the configured client (here: the retry budget)."""
    from agentrl.config import build_config
    from agentrl.rollout.tools.client import named_client, register_tool_servers

    tok = tiny_tokenizer

    async def go():
        async with serve(make_app()) as base:
            cfg = build_config({"tools": {"servers": {"calc": {"url": base, "max_retries": 1, "read_timeout_s": 2.0}}},
                                "env": {"import_path": "envs.calculator:CalculatorEnv",
                                        "kwargs": {"tool_server": "calc"}}})
            register_tool_servers(cfg.tools.servers)
            try:
                spec = EpisodeSpec(CalculatorEnv, {"tool_server": "calc", "tokenizer": tok}, ChatFormat(tok),
                                   RolloutConfig(max_tokens_per_turn=400, turn_timeout_s=5), 2048)
                ep = await run_episode(TASK, ScriptedEngine(tok, [CALL, "3293"]), spec)
                client = named_client("calc")
                return ep, client.config.url, client.config.max_retries, client.config.read_timeout_s, base
            finally:
                register_tool_servers({})
                await aclose_shared()

    ep, url, retries, read_timeout, base = asyncio.run(asyncio.wait_for(go(), 20))
    assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True)
    assert ep.messages[3] == {"role": "tool", "content": "3293", "name": "calculator"}
    assert (url, retries, read_timeout) == (base.rstrip("/"), 1, 2.0)


def test_tool_server_names_and_urls_are_checked_with_the_config():
    from agentrl.config import ConfigError, build_config, load_config

    with pytest.raises(ConfigError, match=r"env.kwargs.tool_server='calc' is not a server of tools.servers \(\['calculator'\]\)"):
        build_config({"tools": {"servers": {"calculator": {"url": "http://127.0.0.1:1"}}},
                      "env": {"kwargs": {"tool_server": "calc"}}})
    with pytest.raises(ConfigError, match="tools.servers.calculator.url"):
        load_config("examples/agents/calculator.yaml", ["tools.servers.calculator.url=ftp://x"])
    with pytest.raises(ValueError, match="one of tool_server"):
        CalculatorEnv(tool_url="http://127.0.0.1:1", tool_server="calculator")
