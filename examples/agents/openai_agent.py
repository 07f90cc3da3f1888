"""The calculator task written as a plain `openai` tool-calling loop, trained unchanged through AgentEnv.

`solve` is agent code as one writes it against any OpenAI-compatible server: chat completions with
`tools`, the model's `tool_calls` run against the tool server over HTTP, results sent back as `tool`
messages, until the model answers. Nothing in it knows about training. `CalculatorAgent` is the
only agentrl part: it hands `solve` the client agentrl built (pointed at the episode's session of the
run's endpoint, whose ledger records every token) and returns the reward.

The messages are those `envs.calculator.CalculatorEnv` shows the model (the compact system prompt, the
tool server's specs as `tools`, results cut to 32 bytes), so the embedded default model's calculator
warm start applies unchanged. Start the reference tool server, then train:

    python -m rewards.servers.tools --port 8765 &
    python -m agentrl.train --config examples/agents/openai_agent.yaml

Against a served model instead (`python -m agentrl.serve --model runs/openai_agent/model --port 8000`):

    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    await solve(client, httpx.AsyncClient(base_url="http://127.0.0.1:8765"), task)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from agentrl.env import AgentEnv
from envs.calculator import CalculatorEnv
from rewards.rules import last_number, numeric_match


async def run_tool(tools_http: httpx.AsyncClient, name: str, arguments: str) -> tuple[str, bool]:
    """(content for the model, whether the tool ran); a tool server that fails raises (the episode ends)."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return f"error: arguments are not JSON: {exc}", False
    response = await tools_http.post("/call", json={"name": name, "arguments": args})
    response.raise_for_status()
    body = response.json()
    return body["content"], not body.get("is_error", False)


async def solve(client: Any, tools_http: httpx.AsyncClient, task: dict[str, Any], max_turns: int = 3,
                result_chars: int = 32) -> dict[str, Any]:
    """Answer "What is a op b?" with the calculator; returns the reward and what happened."""
    tools = (await tools_http.get("/tools")).raise_for_status().json()["tools"]
    names = [t["function"]["name"] for t in tools]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Tools: {', '.join(names)}."},
        {"role": "user", "content": f"What is {task['a']} {task['op']} {task['b']}?"}]
    tool_success = False
    for turn in range(max_turns):
        out = await client.chat.completions.create(model="agentrl", messages=messages, tools=tools)
        reply = out.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if reply.tool_calls:
            for call in reply.tool_calls:
                if call.function.name in names:
                    content, ran = await run_tool(tools_http, call.function.name, call.function.arguments)
                else:
                    content, ran = f"error: unknown tool {call.function.name!r}; tools: {sorted(names)}", False
                tool_success = tool_success or ran
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content[:result_chars]})
            continue
        if last_number(reply.content or "") is None:
            messages.append({"role": "user", "content": "Reply with a number, or call a tool."})
            continue
        reward = numeric_match(reply.content, task["answer"])
        return {"reward": reward, "success": reward == 1.0, "tool_success": tool_success, "turns": turn + 1}
    return {"reward": 0.0, "success": False, "tool_success": tool_success, "turns": max_turns}


# One tool-server client per URL and event loop, shared by the episodes: making an httpx client
# builds an SSL context (~20 ms), which per episode cost more than the rest of the agent's work.
_TOOL_CLIENTS: dict[tuple[str, int], httpx.AsyncClient] = {}


def tools_client(url: str, timeout_s: float) -> httpx.AsyncClient:
    key = (url, id(asyncio.get_running_loop()))
    if key not in _TOOL_CLIENTS:
        _TOOL_CLIENTS[key] = httpx.AsyncClient(base_url=url, timeout=timeout_s)
    return _TOOL_CLIENTS[key]


class CalculatorAgent(AgentEnv):
    """`solve` as an AgentEnv; tasks are the calculator env's (`data.task_kwargs` as for it)."""

    def __init__(self, tool_url: str, max_turns: int = 3, result_chars: int = 32, timeout_s: float = 10.0) -> None:
        self.tool_url, self.max_turns, self.result_chars = tool_url.rstrip("/"), max_turns, result_chars
        self.timeout_s = timeout_s

    async def run(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        tools_http = tools_client(self.tool_url, self.timeout_s)
        return await solve(client, tools_http, task, self.max_turns, self.result_chars)

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, **kwargs: Any) -> list[dict[str, Any]]:
        return CalculatorEnv.make_tasks(n, seed, split, **kwargs)
