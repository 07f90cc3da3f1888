"""Tutorial env, part 2 (docs/tutorials/first-env.md): the same walk, with the way to the goal behind a tool.

After a move the env now only says "Moved."; the way to the goal ("It is 2 right, 1 up.") comes from a
tool, `compass` (no arguments), that the model calls whenever it wants. A call costs a turn, so the budget
is twice part 1's (a call before each move). The tool is local: the env runs it itself, in Python, in `step`.

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
COMPASS = {"type": "function", "function": {
    "name": "compass", "description": "Which way the goal is from here.",
    "parameters": {"type": "object", "properties": {}}}}
# A call as the model writes it (the Hermes format: rollout.tool_format, default hermes).
CALL = '<tool_call>{"name": "compass", "arguments": {}}</tool_call>'
OPENING = "Walk to the goal. Call compass to see which way it is."


def compass_message(x: int, y: int, goal: list[int]) -> Message:
    return {"role": "tool", "name": "compass", "content": where(x, y, goal)}


class GridWalkToolEnv(GridWalkEnv):
    tools = [COMPASS]

    async def reset(self, task: dict[str, Any]) -> str:
        await super().reset(task)  # the walker's state, as in part 1
        return OPENING

    async def step(self, action: Action) -> StepResult:
        if not (action.tool_calls or action.tool_parse_error):
            result = await super().step(action)  # a move: part 1's rules, turn count and reward
            if action.text.strip().lower() in MOVES and not result.done:
                result.observation = "Moved."  # part 1 would say which way: now that is the tool's job
            return result
        # A tool call: run it here. It spends a turn and earns nothing by itself.
        self.turns_left -= 1
        out_of_turns = self.turns_left == 0
        if action.tool_parse_error or [c.name for c in action.tool_calls] != ["compass"]:
            # The model's mistake, not the env's: an error message, and the episode goes on.
            error = action.tool_parse_error or "call compass, once"
            message: Message = {"role": "tool", "name": "compass", "content": f"error: {error}"}
            return StepResult([message], 0.0, out_of_turns, {"success": False, "tool_success": False})
        # `tool_success`: the tool-call success rate of the metrics and the summary.
        return StepResult([compass_message(self.x, self.y, self.goal)], 0.0, out_of_turns,
                          {"success": False, "tool_success": True})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, size: int = 4, slack: int = 2) -> list[dict[str, Any]]:
        tasks = super().make_tasks(n, seed, split, size, slack)
        for task in tasks:
            task["turns"] *= 2  # part 1's moves, each with a call before it
        return tasks


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return GridWalkToolEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float) -> list[Message]:
    """The teacher calls compass before each move, then moves as part 1's teacher does (a good move with
    probability `optimal_prob`), until it reaches the goal or runs out of turns."""
    (x, y), goal = task["start"], task["goal"]
    messages: list[Message] = [{"role": "user", "content": OPENING}]
    turns = task["turns"]
    while turns >= 2:
        messages += [{"role": "assistant", "content": CALL}, compass_message(x, y, goal)]
        move = teacher_move(x, y, goal, rng, optimal_prob)
        messages.append({"role": "assistant", "content": move})
        x, y = moved(x, y, move, task["size"])
        turns -= 2
        if [x, y] == goal or turns == 0:
            break
        messages.append({"role": "user", "content": "Moved."})
    return messages
