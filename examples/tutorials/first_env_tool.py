"""Tutorial env, part 2 (docs/tutorials/first-env.md): the same walk with the goal hidden behind a tool.

The first message says where the walker is but not where the goal is. The env has one tool, `find_goal`
(no arguments), that answers with the goal's square. A call costs a turn, so the budget is one turn
longer than part 1's. The tool is local: the env runs it itself, in Python, inside `step`.

Run it (from the repository root):
    python -m agentrl.train --config examples/tutorials/first_env_tool.yaml
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.env import Action, Message, StepResult
from examples.tutorials.first_env import MOVES, GridWalkEnv, moved, teacher_move, where

# The tool as an OpenAI function spec. The env declares it in `tools`: a chat template that renders
# tools shows it to the model. The embedded model's template does not; it learns the call from the
# warm start's demonstrations, and the first message names the tool.
FIND_GOAL = {"type": "function", "function": {
    "name": "find_goal", "description": "The square of the goal, as (x, y).",
    "parameters": {"type": "object", "properties": {}}}}
# A call as the model writes it (the Hermes format: rollout.tool_format, default hermes).
CALL = '<tool_call>{"name": "find_goal", "arguments": {}}</tool_call>'


def opening(task: dict[str, Any]) -> str:
    x, y = task["start"]
    return f"{where(x, y)} Call find_goal, then move."


def goal_message(task: dict[str, Any]) -> Message:
    gx, gy = task["goal"]
    return {"role": "tool", "name": "find_goal", "content": f"({gx}, {gy})"}


class GridWalkToolEnv(GridWalkEnv):
    tools = [FIND_GOAL]

    async def reset(self, task: dict[str, Any]) -> str:
        await super().reset(task)  # the walker's state, as in part 1
        self.task, self.called = task, False
        return opening(task)

    async def step(self, action: Action) -> StepResult:
        if not (action.tool_calls or action.tool_parse_error):
            result = await super().step(action)  # a move: part 1's rules and reward
            result.info["tool_success"] = self.called
            return result
        # A tool call: run it here. It spends a turn and earns nothing by itself.
        self.turns_left -= 1
        out_of_turns = self.turns_left == 0
        info = {"success": False}
        if action.tool_parse_error or [c.name for c in action.tool_calls] != ["find_goal"]:
            # The model's mistake, not the env's: an error message, and the episode goes on.
            error = action.tool_parse_error or "call find_goal, once"
            message: Message = {"role": "tool", "name": "find_goal", "content": f"error: {error}"}
            return StepResult([message], 0.0, out_of_turns, {**info, "tool_success": self.called})
        self.called = True  # `tool_success`: the tool-call success rate in the metrics and summary
        return StepResult([goal_message(self.task)], 0.0, out_of_turns, {**info, "tool_success": True})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, size: int = 4, slack: int = 2) -> list[dict[str, Any]]:
        tasks = super().make_tasks(n, seed, split, size, slack)
        for task in tasks:
            task["turns"] += 1  # one turn for the call
        return tasks


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return GridWalkToolEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float) -> list[Message]:
    """With probability `optimal_prob` the teacher calls find_goal first, then walks as part 1's teacher
    does; otherwise it never calls and walks at random (it does not know where the goal is)."""
    x, y = task["start"]
    goal, turns = task["goal"], task["turns"]
    messages: list[Message] = [{"role": "user", "content": opening(task)}]
    knows = rng.random() < optimal_prob
    if knows:
        messages += [{"role": "assistant", "content": CALL}, goal_message(task)]
        turns -= 1
    for turn in range(turns):
        move = teacher_move(x, y, goal, rng, optimal_prob) if knows else rng.choice(list(MOVES))
        messages.append({"role": "assistant", "content": move})
        x, y = moved(x, y, move, task["size"])
        if [x, y] == goal or turn == turns - 1:
            break
        messages.append({"role": "user", "content": where(x, y)})
    return messages

