"""Agents written in Node.js with the official SDKs (`openai`, `@anthropic-ai/sdk` from npm;
examples/process_agents/node) run as their own process against a real agentrl endpoint on loopback:
the session URL and key come from the standard environment variables, the task from stdin, and the
reward goes to $AGENTRL_REWARD_FILE. The endpoint's engine is scripted (tests/fake_engine.py), so the
tests are about the protocol: what the session's ledger (GET /sessions/<id>) recorded, exactly, and the
reward the process wrote. The reference tool server (rewards.servers.tools) runs in-process.

The SDKs are installed by `./scripts/install.sh test` (`npm ci --prefix examples/process_agents/node`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from agentrl.config import ServerConfig
from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import get_tool_format
from rewards.servers.tools import TOOL_SPECS, make_app
from tests.fake_engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "examples" / "process_agents" / "node"
NODE = shutil.which("node")
INSTALLED = (AGENTS / "node_modules" / "openai").is_dir() and (AGENTS / "node_modules" / "@anthropic-ai" / "sdk").is_dir()
NEEDS = "node and the agents' npm packages: ./scripts/install.sh test (npm ci --prefix examples/process_agents/node)"
if NODE is None or not INSTALLED:
    if os.environ.get("CI"):  # the test command installs them: their absence there is a failure, not a skip
        raise RuntimeError(f"tests/test_node_agents.py needs {NEEDS}")
    pytestmark = pytest.mark.skip(reason=f"needs {NEEDS}")

TASK = {"id": "t-0", "a": 437, "op": "*", "b": 89, "answer": 38893}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "437 * 89"}}</tool_call>'
SYSTEM = {"role": "system", "content": "Tools: calculator, lookup."}
QUESTION = {"role": "user", "content": "What is 437 * 89?"}
KEY = "node-agent-key"


@asynccontextmanager
async def served(tokenizer, script):
    """An agentrl endpoint (scripted engine, api key set) and the reference tool server, both on loopback."""
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(tokenizer, script)
    srv = OpenAIServer(fmt, ServerConfig(port=0, api_key=KEY), get_tool_format("hermes"), Limits(2048, 200, 8),
                       engine=engine)
    await srv.start()
    tools = web.AppRunner(make_app(), access_log=None)
    await tools.setup()
    await web.TCPSite(tools, "127.0.0.1", 0).start()
    tool_url = f"http://127.0.0.1:{tools.addresses[0][1]}"
    try:
        yield srv, engine, fmt, tool_url
    finally:
        await tools.cleanup()
        await srv.stop()


async def run_agent(script_name: str, env: dict[str, str], task: dict, tmp_path: Path) -> tuple[int, str, dict | None]:
    """Runs a node agent as agentrl runs a process agent: (exit code, stderr, the reward file's JSON or None)."""
    reward_file = tmp_path / f"{script_name}.reward.json"
    proc = await asyncio.create_subprocess_exec(
        NODE, str(AGENTS / script_name), cwd=tmp_path, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "AGENTRL_REWARD_FILE": str(reward_file), **env})
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(task).encode()), timeout=60)
    reward = json.loads(reward_file.read_text()) if reward_file.exists() else None
    return proc.returncode, err.decode(), reward


async def open_session(srv: OpenAIServer) -> tuple[str, str]:
    """POST /sessions as a client of agentrl.serve does: (session id, its OpenAI base URL)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
        opened = (await http.post(f"{srv.url}/sessions")).raise_for_status().json()
    return opened["id"], opened["base_url"]


async def ledger(srv: OpenAIServer, sid: str) -> dict:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
        return (await http.get(f"{srv.url}/sessions/{sid}")).raise_for_status().json()


def agent_env(base_url: str, tool_url: str) -> dict[str, str]:
    """The variables a process agent gets: both SDKs' base URLs and keys for the session, the tool server."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": KEY, "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": KEY, "CALCULATOR_TOOL_URL": tool_url}


async def play(tokenizer, script_name: str, script: list[str], tmp_path: Path, task: dict = TASK):
    async with served(tokenizer, script) as (srv, engine, fmt, tool_url):
        sid, base_url = await open_session(srv)
        rc, err, reward = await run_agent(script_name, agent_env(base_url, tool_url), task, tmp_path)
        return rc, err, reward, await ledger(srv, sid), engine, fmt, srv.stats()


def assert_append_only(book: dict, engine: ScriptedEngine) -> None:
    """Every request's prompt was the ledger so far (nothing re-tokenised), the generated tokens are the
    engine's with their logprobs and loss mask 1, and nothing split the ledger."""
    assert book["segments"] == []
    tokens, mask, logprobs = book["tokens"], book["loss_mask"], book["logprobs"]
    for call in engine.calls:
        start, out = len(call.prompt_ids), call.output
        assert tokens[:start] == call.prompt_ids
        assert tokens[start:start + len(out.token_ids)] == out.token_ids
        assert mask[start:start + len(out.token_ids)] == [1] * len(out.token_ids)
        assert logprobs[start:start + len(out.token_ids)] == out.logprobs
    assert sum(mask) == sum(len(c.output.token_ids) for c in engine.calls)


def test_openai_node_agent_records_its_tool_round_trip_and_writes_the_reward(tiny_tokenizer, tmp_path):
    rc, err, reward, book, engine, fmt, stats = asyncio.run(
        play(tiny_tokenizer, "openai_agent.mjs", [CALL, "38893"], tmp_path))
    assert rc == 0, err
    assert reward == {"reward": 1.0, "success": True, "tool_success": True, "turns": 2}
    final = [SYSTEM, QUESTION, {"role": "assistant", "content": CALL},
             {"role": "tool", "name": "calculator", "content": "38893"}, {"role": "assistant", "content": "38893"}]
    tokens, mask = ledger_from_messages(fmt, final, TOOL_SPECS)
    assert (book["tokens"], book["loss_mask"]) == (tokens, mask)  # the template's rendering, exactly
    assert [m["role"] for m in book["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert len(engine.calls) == 2 and stats["ledger/segments_split"] == 0
    assert_append_only(book, engine)


def test_openai_node_agent_wrong_answer_is_reward_zero(tiny_tokenizer, tmp_path):
    rc, err, reward, book, engine, _, _ = asyncio.run(
        play(tiny_tokenizer, "openai_agent.mjs", ["It is 40000."], tmp_path))
    assert rc == 0, err
    assert reward == {"reward": 0.0, "success": False, "tool_success": False, "turns": 1}
    assert [m["role"] for m in book["messages"]] == ["system", "user", "assistant"]
    assert_append_only(book, engine)


def test_a_node_agent_refused_by_the_endpoint_exits_non_zero_naming_why(tiny_tokenizer, tmp_path):
    """A wrong key is a 401 the SDK raises: the process exits 1 with the server's message, no reward file."""
    async def go():
        async with served(tiny_tokenizer, [CALL]) as (srv, engine, fmt, tool_url):
            sid, base_url = await open_session(srv)
            env = {**agent_env(base_url, tool_url), "OPENAI_API_KEY": "wrong"}
            return (*await run_agent("openai_agent.mjs", env, TASK, tmp_path), engine)

    rc, err, reward, engine = asyncio.run(go())
    assert (rc, reward, engine.calls) == (1, None, [])
    assert "401" in err and "Authorization: Bearer" in err  # the server's message, as the SDK raised it


def test_anthropic_node_agent_records_its_tool_use_round_trip_and_writes_the_reward(tiny_tokenizer, tmp_path):
    rc, err, reward, book, engine, fmt, stats = asyncio.run(
        play(tiny_tokenizer, "anthropic_agent.mjs", [CALL, "38893"], tmp_path))
    assert rc == 0, err
    assert reward == {"reward": 1.0, "success": True, "tool_success": True, "turns": 2}
    # The system prompt, question, tool_use reply, tool_result and answer, in the order the agent sent them.
    assert [m["role"] for m in book["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    text = fmt.tokenizer.decode(book["tokens"])
    assert SYSTEM["content"] in text and QUESTION["content"] in text
    assert text.count('"expression": "437 * 89"') == 1 and text.rstrip().endswith("38893<|im_end|>")
    assert len(engine.calls) == 2 and stats["ledger/segments_split"] == 0
    assert_append_only(book, engine)


@pytest.mark.parametrize("script", ["openai_agent.mjs", "anthropic_agent.mjs"])
def test_node_agents_run_as_a_process_agent_env(tiny_tokenizer, script):
    """The same agents as ProcessAgentEnv runs them per episode (its environment, task on stdin, reward file
    in the episode's working directory): the reward dict comes back and the episode's ledger holds the turns."""
    from agentrl.rollout import process_agent
    from agentrl.types import Episode

    async def go():
        async with served(tiny_tokenizer, [CALL, "38893"]) as (srv, engine, fmt, tool_url):
            ep = Episode("t-0", 0)
            session = srv.open_session(engine, ep)
            env = process_agent.ProcessAgentEnv(command=[NODE, str(AGENTS / script)],
                                                env={"CALCULATOR_TOOL_URL": tool_url})
            result = await env.run(srv.client(session.base_url, 30.0), TASK)
            return result, ep, engine

    result, ep, engine = asyncio.run(go())
    assert result["reward"] == 1.0 and result.get("success") is True
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert len(engine.calls) == 2 and ep.segments == []
    assert sum(ep.loss_mask) == sum(len(c.output.token_ids) for c in engine.calls)
