"""Multi-turn arithmetic with a remote calculator tool: "What is 437 * 89?".

The numbers are large enough that a model should call the tool rather than guess. The env
discovers the tool server's specs at reset (once per URL: episodes share one client), declares them as `tools`, runs the
model's calls through `agentrl.rollout.tools.client.RemoteToolClient` and shows each result as a
`{"role": "tool"}` message cut to `result_token_budget` tokens. The episode ends when the model
replies with a number and no tool call (reward 1.0 if it is the answer, by
`rewards.rules.numeric_match`, else 0.0), or after `max_turns`.

A malformed call (the Action carries `tool_parse_error`) or an unknown tool name is the model's
mistake: it gets an error message and the episode goes on. A tool server that fails (discovery,
or a call whose status is error/timeout) is not: the env raises RemoteToolError, so the episode
ends with status env_error and is counted, never scored as reward 0.

`info["tool_success"]` (in every step's info, so in `Episode.info["env"]`) says whether the episode
has made at least one call that the server executed (status ok and not is_error): the tool-call
success rate of `agentrl.train`'s eval.

`demonstration` writes the message sequence this env would produce for a (deliberately imperfect)
teacher, for the embedded default model's warm start (`model.default.task: calculator`).

Run the reference server with `python -m rewards.servers.tools --port 8765`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import uuid
from typing import Any

from agentrl.env import Action, Env, Message, StepResult, ToolCall
from agentrl.rollout.tools.budget import truncate_to_tokens
from agentrl.rollout.tools.client import RemoteToolClient, RemoteToolError, named_client, shared_client
from rewards.rules import last_number, numeric_match

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class CalculatorEnv(Env):
    def __init__(self, tool_url: str | None = None, result_token_budget: int = 32, max_turns: int = 4,
                 max_calls_per_turn: int = 8, tokenizer: Any = None, describe_tools: bool = True,
                 compact_tools: bool = False, client: dict[str, Any] | None = None,
                 tool_server: str | None = None) -> None:
        """`tool_server`: the name of the server in the config's `tools.servers` (its URL and client
        settings come from there); or, outside a config, `tool_url` with `client` settings. `tokenizer`: a tokenizer or a Hugging Face path, for the result budget (None: count UTF-8 bytes,
        which never undercounts a byte-level BPE). `client`: ToolServerConfig fields (timeouts, retries, ...)
        for the first client made for this URL on the event loop. `describe_tools` adds a system message
        naming the tools and the call format, for chat templates that do not render `tools`;
        `compact_tools` leaves the call format out of it (for a model warm-started on the format, whose
        context is small)."""
        if (tool_url is None) == (tool_server is None):
            raise ValueError("CalculatorEnv takes one of tool_server (a name in tools.servers) or tool_url")
        self.tool_server = tool_server
        self.tool_url = (tool_url or "").rstrip("/")
        self.budget = result_token_budget
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.tokenizer = _load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.describe_tools = describe_tools
        self.compact_tools = compact_tools
        self.client_config = client or {}
        self.tools: list[dict[str, Any]] = []
        self.turn = 0
        self.tool_success = False  # a call ran on the server (status ok, not is_error)
        self.episode_key = uuid.uuid4().hex  # prefix of each call's Idempotency-Key

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task, self.turn = task, 0
        self.client: RemoteToolClient = (named_client(self.tool_server) if self.tool_server else
                                         shared_client(self.tool_url, **self.client_config))
        self.tool_url = self.client.config.url
        self.tools = await self.client.tools()  # discovered once per URL and event loop; RemoteToolError if down
        names = [spec["function"]["name"] for spec in self.tools]
        return initial_messages(task, names, self.describe_tools, self.compact_tools)

    async def step(self, action: Action) -> StepResult:
        self.turn += 1
        last = self.turn >= self.max_turns
        if action.tool_parse_error:  # the whole turn is rejected, also calls parsed before the bad one
            hint = 'write <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
            return StepResult([tool_message(None, f"error: {action.tool_parse_error}; {hint}")], 0.0, last,
                              self._info(False, tool_error="parse"))
        if action.tool_calls:
            return StepResult(await self._run_calls(action.tool_calls), 0.0, last, self._info(False))
        if last_number(action.text) is None:
            return StepResult("Reply with a number, or call a tool.", 0.0, last, self._info(False))
        reward = numeric_match(action.text, self.task["answer"])
        return StepResult(None, reward, True, self._info(reward == 1.0, turns=self.turn))

    def _info(self, success: bool, **extra: Any) -> dict[str, Any]:
        return {"success": success, "tool_success": self.tool_success, **extra}

    async def _run_calls(self, calls: list[ToolCall]) -> list[Message]:
        """One tool message per call, in call order; raises RemoteToolError if the server failed."""
        if len(calls) > self.max_calls_per_turn:
            return [tool_message(None, f"error: {len(calls)} calls in one turn; at most {self.max_calls_per_turn}")]
        known = {spec["function"]["name"] for spec in self.tools}
        results: list[Any] = [None] * len(calls)
        async with asyncio.TaskGroup() as tg:
            for i, call in enumerate(calls):
                if call.name in known:
                    key = f"{self.episode_key}:{self.turn}:{i}"
                    results[i] = tg.create_task(self.client.call(call.name, call.arguments, key))
        messages = []
        for call, job in zip(calls, results):
            if job is None:
                messages.append(tool_message(call.name, f"error: unknown tool {call.name!r}; tools: {sorted(known)}"))
                continue
            result = job.result()
            if not result.ok:
                info = result.info
                raise RemoteToolError(
                    f"tool {call.name!r} at {self.tool_url} failed ({result.status}, {info.get('kind')}, "
                    f"{info.get('attempts')} attempt(s)) on arguments {call.arguments}: {info.get('error')}")
            self.tool_success = self.tool_success or not result.info.get("is_error", False)
            messages.append(tool_message(call.name, truncate_to_tokens(result.content, self.tokenizer, self.budget)))
        return messages

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, low: int = 12, high: int = 999,
                   ops: str = "+-*") -> list[dict[str, Any]]:
        # Independent streams per split, so eval tasks are never the train stream.
        rng = random.Random(f"calculator:{split}:{seed}")
        tasks = []
        for i in range(n):
            a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice(ops)
            tasks.append({"id": f"{split}-{i}", "a": a, "b": b, "op": op, "answer": OPS[op](a, b)})
        return tasks


def system_prompt(tool_names: list[str], compact: bool = False) -> str:
    """The system message naming the tools (short: the embedded model's context is 512 tokens)."""
    names = ", ".join(tool_names)
    if compact:
        return f"Tools: {names}."
    return (f"Tools: {names}. Call one as "
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>. '
            "Reply with only the number when you know the answer.")


def initial_messages(task: dict[str, Any], tool_names: list[str], describe_tools: bool = True,
                     compact_tools: bool = False) -> list[Message]:
    question: Message = {"role": "user", "content": f"What is {task['a']} {task['op']} {task['b']}?"}
    if not describe_tools:
        return [question]
    return [{"role": "system", "content": system_prompt(tool_names, compact_tools)}, question]


def tool_message(name: str | None, content: str) -> Message:
    message: Message = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    return message


# ---------------------------------------------------------------- warm-start demonstrations

# Two-digit operands: small enough for the ~1M-parameter embedded model to learn to copy them into a
# call, large enough that it cannot multiply them itself. examples/agents/calculator.yaml uses the same.
DEMO_TASK_KWARGS: dict[str, Any] = {"low": 10, "high": 99, "ops": "+-*"}


# The warm start's default share of best moves (model.default.demo_optimal_prob unset): this task's RL
# gains were measured from a teacher this imperfect.
DEMO_OPTIMAL_PROB = 0.3


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return CalculatorEnv.make_tasks(n, seed, split, **DEMO_TASK_KWARGS)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float, describe_tools: bool = True,
                  compact_tools: bool = True, result_token_budget: int = 32) -> list[Message]:
    """A teacher episode, message for message what `CalculatorEnv` (with these settings and
    `tokenizer=None`) produces against the reference tool server, whose evaluator runs here in-process.

    With probability `optimal_prob` the teacher calls the calculator on the question and copies the
    result. Otherwise it is deliberately imperfect, so that RL has something to improve: half of the
    time it skips the tool and answers a rough estimate; a quarter, it miscopies an operand (the tool
    runs, the answer is wrong); a quarter, it writes an expression the server rejects ("37 * 89 =",
    is_error) and then answers an estimate.
    """
    from rewards.servers.tools import TOOL_SPECS, ToolArgumentError, calculate

    a, b, op = task["a"], task["b"], task["op"]
    names = [spec["function"]["name"] for spec in TOOL_SPECS]
    messages = initial_messages(task, names, describe_tools, compact_tools)
    estimate = str(OPS[op](round(a, -1), round(b, -1)))
    kind = "tool" if rng.random() < optimal_prob else rng.choice(("skip", "skip", "miscopy", "syntax"))
    if kind == "skip":
        return messages + [{"role": "assistant", "content": estimate}]
    if kind == "miscopy":
        a = max(0, a + rng.choice((-1, 1)) * rng.randint(1, 3))
    expression = f"{a} {op} {b}" + (" =" if kind == "syntax" else "")
    call = {"name": "calculator", "arguments": {"expression": expression}}
    try:
        content = calculate(expression)
    except ToolArgumentError as exc:  # what the server answers, with is_error: true
        content = f"error: {exc}"
    messages.append({"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"})
    messages.append(tool_message("calculator", truncate_to_tokens(content, None, result_token_budget)))
    messages.append({"role": "assistant", "content": estimate if kind == "syntax" else content})
    return messages
