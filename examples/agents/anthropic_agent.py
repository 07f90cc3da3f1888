"""The calculator task written against Anthropic's Messages API (the official `anthropic` client), trained
unchanged through AgentEnv, as examples/agents/openai_agent.py is with `openai`.

`solve` is agent code as one writes it for Claude: `messages.create` with `tools` (name, description,
`input_schema`), the model's `tool_use` blocks run against the tool server over HTTP, results sent back
as `tool_result` blocks in the next user turn, until the model answers. `AnthropicCalculatorAgent`
declares `api = "anthropic"`, so agentrl hands it an `anthropic.AsyncAnthropic` pointed at the episode's
session; the run's endpoint serves `/v1/messages` on the same token ledger as chat completions.

The conversation is the one `openai_agent.solve` has (same system prompt, tools, tool results cut to 32
bytes), so the chat template renders the same tokens and calculator.yaml's warm start applies unchanged.

    python -m rewards.servers.tools --port 8765 &
    python -m agentrl.train --config examples/agents/anthropic_agent.yaml

Against a served model instead (`python -m agentrl.serve --model runs/anthropic_agent/model --port 8000`):

    client = anthropic.AsyncAnthropic(base_url="http://127.0.0.1:8000", api_key="unused")
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentrl.env import AgentEnv
from envs.calculator import CalculatorEnv
from examples.agents.openai_agent import run_tool, tools_client
from rewards.rules import last_number, numeric_match


def anthropic_tools(openai_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool server's specs (OpenAI's function shape) as Messages API tools."""
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"].get("parameters", {"type": "object", "properties": {}})}
            for t in openai_tools]


async def solve(client: Any, tools_http: httpx.AsyncClient, task: dict[str, Any], max_turns: int = 3,
                result_chars: int = 32, max_tokens: int = 40) -> dict[str, Any]:
    """Answer "What is a op b?" with the calculator; returns the reward and what happened."""
    tools = anthropic_tools((await tools_http.get("/tools")).raise_for_status().json()["tools"])
    names = [t["name"] for t in tools]
    system = f"Tools: {', '.join(names)}."
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is {task['a']} {task['op']} {task['b']}?"}]
    tool_success = False
    for turn in range(max_turns):
        out = await client.messages.create(model="agentrl", max_tokens=max_tokens, system=system,
                                           messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]})
        calls = [b for b in out.content if b.type == "tool_use"]
        if calls:
            results = []
            for call in calls:
                if call.name in names:
                    content, ran = await run_tool(tools_http, call.name, json.dumps(call.input))
                else:
                    content, ran = f"error: unknown tool {call.name!r}; tools: {sorted(names)}", False
                tool_success = tool_success or ran
                results.append({"type": "tool_result", "tool_use_id": call.id, "content": content[:result_chars]})
            messages.append({"role": "user", "content": results})
            continue
        text = "".join(b.text for b in out.content if b.type == "text")
        if last_number(text) is None:
            messages.append({"role": "user", "content": "Reply with a number, or call a tool."})
            continue
        reward = numeric_match(text, task["answer"])
        return {"reward": reward, "success": reward == 1.0, "tool_success": tool_success, "turns": turn + 1}
    return {"reward": 0.0, "success": False, "tool_success": tool_success, "turns": max_turns}


class AnthropicCalculatorAgent(AgentEnv):
    """`solve` as an AgentEnv on an `anthropic.AsyncAnthropic`; tasks are the calculator env's."""

    api = "anthropic"

    def __init__(self, tool_url: str, max_turns: int = 3, result_chars: int = 32, timeout_s: float = 10.0,
                 max_tokens: int = 40) -> None:
        self.tool_url, self.max_turns, self.result_chars = tool_url.rstrip("/"), max_turns, result_chars
        self.timeout_s, self.max_tokens = timeout_s, max_tokens

    async def run(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        tools_http = tools_client(self.tool_url, self.timeout_s)
        return await solve(client, tools_http, task, self.max_turns, self.result_chars, self.max_tokens)

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, **kwargs: Any) -> list[dict[str, Any]]:
        return CalculatorEnv.make_tasks(n, seed, split, **kwargs)
