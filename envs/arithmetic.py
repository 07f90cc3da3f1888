"""Single-turn verifiable task: answer "What is a + b?" with the number; scored by a rule reward.

The reward is `rewards.rules.numeric_match` on the model's reply, so the same rule can be reused
as a standalone reward source; a task whose answer cannot be scored raises and ends the episode
with status "env_error" rather than a silent 0.

`demo_tasks` / `demonstration` warm-start the embedded default model on this task
(`model.default.task: arithmetic`): a teacher that is right with probability `optimal_prob` and
otherwise off by a little, so the model starts able to answer and RL has something to improve.
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.env import Action, Env, Message, StepResult
from rewards.rules import numeric_match


def question(task: dict[str, Any]) -> list[Message]:
    return [{"role": "user", "content": f"What is {task['a']} {task['op']} {task['b']}?"}]


class ArithmeticEnv(Env):
    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task = task
        return question(task)

    async def step(self, action: Action) -> StepResult:
        reward = numeric_match(action.text, self.task["answer"])
        return StepResult(None, reward, True, {"success": reward == 1.0})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, max_operand: int = 9) -> list[dict[str, Any]]:
        """`n` questions "a + b" or "a - b" with operands 0..max_operand. The default, single digits (200
        distinct questions), is what the tiny default model can learn: warm-started on operands up to 20
        it answered 11 % right and RL made it no better (issue 28)."""
        rng = random.Random(f"{split}:{seed}")
        tasks = []
        for i in range(n):
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
            op = rng.choice("+-")
            tasks.append({"id": f"{split}-{i}", "a": a, "b": b, "op": op, "answer": a + b if op == "+" else a - b})
        return tasks


# The warm start's default share of best moves (model.default.demo_optimal_prob unset): this task's RL
# gains were measured from a teacher this imperfect.
DEMO_OPTIMAL_PROB = 0.3


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Tasks for the embedded default model's warm start (`model.default.task: arithmetic`): the env's
    default operand range, so the warm start covers the questions `examples/agents/arithmetic.yaml` asks."""
    return ArithmeticEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float) -> list[Message]:
    """A teacher reply: the answer with probability `optimal_prob`, else the answer off by 1 to 3."""
    answer = task["answer"] if rng.random() < optimal_prob else task["answer"] + rng.choice([-3, -2, -1, 1, 2, 3])
    return question(task) + [{"role": "assistant", "content": str(answer)}]
