"""Multi-turn arithmetic with a Python interpreter as the tool: "What is 4821 * 937?".

The tasks are ones where mental arithmetic fails: products of large numbers and sums of many. The
model may call the sandbox server's `python` tool (`python -m rewards.servers.sandbox --port 8766`),
sees what the code printed (stdout and errors, cut to `result_token_budget` tokens), and answers
with a number and no call: reward 1.0 if it is the answer (`rewards.rules.numeric_match`), else 0.0,
or 0.0 after `max_turns`.

Everything else is `envs.calculator.CalculatorEnv`'s: tools discovered from the server at reset, a
malformed call or an unknown tool name is the model's mistake (an error message, the episode goes
on), code that raises or times out is a tool result the model sees (`is_error`), a sandbox that
fails is an infrastructure failure (RemoteToolError: status env_error, never a 0), and
`info["tool_success"]` says whether a call ran without error.

`demo_tasks` / `demonstration` warm-start the embedded default model (`model.default.task:
envs.code_interpreter`): a teacher that writes `print(<the question's expression>)` and copies the
output only `optimal_prob` of the time, and otherwise answers a rough estimate without the tool,
miscopies an operand into its code, or forgets the `print` (the code prints nothing).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from agentrl.env import Message
from agentrl.rollout.tools.budget import truncate_to_tokens
from agentrl.rollout.tools.client import named_client, shared_client
from envs.calculator import CalculatorEnv, tool_message

KINDS = ("mul", "sum")


def expression(task: dict[str, Any]) -> str:
    """The question's arithmetic as Python: "4821 * 937" or "12 + 45 + 78"."""
    return (" * " if task["kind"] == "mul" else " + ").join(str(x) for x in task["numbers"])


def system_prompt(compact: bool) -> str:
    """Short: the embedded model's context is 512 tokens."""
    if compact:
        return "Tools: python."
    return ('Tools: python. Run code as <tool_call>{"name": "python", "arguments": {"code": "print(2 * 3)"}}'
            "</tool_call>; you see what it prints. Reply with only the number when you know the answer.")


def initial_messages(task: dict[str, Any], describe_tools: bool = True, compact_tools: bool = False) -> list[Message]:
    question: Message = {"role": "user", "content": f"What is {expression(task)}?"}
    return [{"role": "system", "content": system_prompt(compact_tools)}, question] if describe_tools else [question]


class CodeInterpreterEnv(CalculatorEnv):
    """CalculatorEnv's turns and tool handling; the sandbox's `python` tool and these tasks. Takes the
    same arguments (`tool_server: sandbox` in a config, or `tool_url`)."""

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task, self.turn = task, 0
        self.client = (named_client(self.tool_server) if self.tool_server else
                       shared_client(self.tool_url, **self.client_config))
        self.tool_url = self.client.config.url
        self.tools = await self.client.tools()  # once per URL and event loop; RemoteToolError if down
        return initial_messages(task, self.describe_tools, self.compact_tools)

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, low: int = 100, high: int = 9999, terms: int = 6,
                   term_low: int = 10, term_high: int = 999, kinds: str = "mul,sum") -> list[dict[str, Any]]:
        """`n` questions: "mul", a product of two numbers in [low, high]; "sum", a sum of `terms`
        numbers in [term_low, term_high]. Independent streams per split."""
        chosen = [k for k in kinds.split(",") if k]
        if not chosen or set(chosen) - set(KINDS):
            raise ValueError(f"kinds must be a comma-separated subset of {','.join(KINDS)}, got {kinds!r}")
        rng = random.Random(f"code_interpreter:{split}:{seed}")
        tasks = []
        for i in range(n):
            kind = rng.choice(chosen)
            numbers = ([rng.randint(low, high) for _ in range(2)] if kind == "mul" else
                       [rng.randint(term_low, term_high) for _ in range(terms)])
            answer = math.prod(numbers) if kind == "mul" else sum(numbers)
            tasks.append({"id": f"{split}-{i}", "kind": kind, "numbers": numbers, "answer": answer})
        return tasks


# ---------------------------------------------------------------- warm-start demonstrations

# Small enough for the ~1M-parameter embedded model to copy into code, too large for it to compute:
# examples/agents/code_interpreter.yaml asks the same.
DEMO_TASK_KWARGS: dict[str, Any] = {"low": 10, "high": 99, "terms": 4, "term_low": 10, "term_high": 99}


# The warm start's default share of best moves (model.default.demo_optimal_prob unset): this task's RL
# gains were measured from a teacher this imperfect.
DEMO_OPTIMAL_PROB = 0.3


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return CodeInterpreterEnv.make_tasks(n, seed, split, **DEMO_TASK_KWARGS)


def _rough(task: dict[str, Any]) -> str:
    """An estimate from operands rounded to tens: what a model without the tool might say."""
    rounded = [round(x, -1) for x in task["numbers"]]
    return str(math.prod(rounded) if task["kind"] == "mul" else sum(rounded))


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float, describe_tools: bool = True,
                  compact_tools: bool = True, result_token_budget: int = 32) -> list[Message]:
    """A teacher episode, message for message what `CodeInterpreterEnv` (these settings,
    `tokenizer=None`) produces against the sandbox, whose output for these one-line programs is their
    printed value and a newline (computed here: the teacher's code is ours, not the model's).

    With probability `optimal_prob` the teacher prints the question's expression and copies the output.
    Otherwise: half of the time it answers a rough estimate without the tool; a quarter, it miscopies
    an operand (the code runs, the answer is wrong); a quarter, it forgets `print` (no output) and
    answers the estimate."""
    messages = initial_messages(task, describe_tools, compact_tools)
    kind = "tool" if rng.random() < optimal_prob else rng.choice(("skip", "skip", "miscopy", "no_print"))
    if kind == "skip":
        return messages + [{"role": "assistant", "content": _rough(task)}]
    numbers = list(task["numbers"])
    if kind == "miscopy":
        i = rng.randrange(len(numbers))
        numbers[i] = max(0, numbers[i] + rng.choice((-1, 1)) * rng.randint(1, 3))
    shown = {**task, "numbers": numbers}
    value = math.prod(numbers) if task["kind"] == "mul" else sum(numbers)
    code, output = (expression(shown), "") if kind == "no_print" else (f"print({expression(shown)})", f"{value}\n")
    call = {"name": "python", "arguments": {"code": code}}
    messages.append({"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"})
    messages.append(tool_message("python", truncate_to_tokens(output, None, result_token_budget)))
    messages.append({"role": "assistant", "content": _rough(task) if kind == "no_print" else str(value)})
    return messages
