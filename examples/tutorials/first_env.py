"""Tutorial env (docs/tutorials/first-env.md): walk a small grid to a goal.

The model stands on a `size` x `size` grid and is told which way the goal is ("It is 2 right, 1 up.").
Each turn it says one move: up, down, left or right. The env answers with the way from its new square.
Reaching the goal within the task's turn budget (the shortest walk plus `slack` turns) earns 1; running
out of turns earns 0.

Run it (from the repository root):
    python -m agentrl.train --config examples/tutorials/first_env.yaml
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.env import Action, Env, Message, StepResult

MOVES = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}


def where(x: int, y: int, goal: list[int]) -> str:
    """The way from (x, y) to the goal, e.g. "It is 2 right, 1 up." (a zero step is left out)."""
    dx, dy = goal[0] - x, goal[1] - y
    parts = []
    if dx:
        parts.append(f"{abs(dx)} {'right' if dx > 0 else 'left'}")
    if dy:
        parts.append(f"{abs(dy)} {'up' if dy > 0 else 'down'}")
    return f"It is {', '.join(parts)}."


def opening(task: dict[str, Any]) -> str:
    """The first message: the task, and the way from the start to the goal."""
    return f"Walk to the goal. {where(*task['start'], task['goal'])}"


def moved(x: int, y: int, move: str, size: int) -> tuple[int, int]:
    """The square `move` leads to from (x, y); a move off the grid stays put."""
    dx, dy = MOVES[move]
    if 0 <= x + dx < size and 0 <= y + dy < size:
        return x + dx, y + dy
    return x, y


class GridWalkEnv(Env):
    # One instance plays one episode, so the walker's position lives on `self`.
    async def reset(self, task: dict[str, Any]) -> str:
        # `task` is one row made by make_tasks below (or read from a jsonl file).
        self.x, self.y = task["start"]
        self.goal = list(task["goal"])
        self.size, self.turns_left = task["size"], task["turns"]
        # A plain string is shown to the model as one user message.
        return opening(task)

    async def step(self, action: Action) -> StepResult:
        self.turns_left -= 1
        out_of_turns = self.turns_left == 0
        move = action.text.strip().lower()
        if move not in MOVES:
            # Not a move: a hint, and the turn is spent (the model learns to answer in the format).
            return StepResult("Say up, down, left or right.", 0.0, out_of_turns, {"success": False})
        self.x, self.y = moved(self.x, self.y, move, self.size)
        if [self.x, self.y] == self.goal:
            return StepResult(None, reward=1.0, done=True, info={"success": True})
        return StepResult(where(self.x, self.y, self.goal), 0.0, out_of_turns, {"success": False})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, size: int = 4, slack: int = 2) -> list[dict[str, Any]]:
        # The run calls this when the YAML names no dataset file; `data.task_kwargs` fills size and slack.
        # Each split draws from its own stream, so the held-out tasks are not the training ones.
        rng = random.Random(f"grid:{split}:{seed}")
        tasks = []
        for i in range(n):
            start = [rng.randrange(size), rng.randrange(size)]
            goal = start
            while goal == start:
                goal = [rng.randrange(size), rng.randrange(size)]
            shortest = abs(goal[0] - start[0]) + abs(goal[1] - start[1])
            # Lists, not tuples: a task must come back from JSON as itself (checkpoints keep tasks as JSON).
            tasks.append({"id": f"{split}-{i}", "size": size, "start": start, "goal": goal,
                          "turns": shortest + slack})
        return tasks


# The embedded default model's warm start (`model.default.task: examples.tutorials.first_env` in the
# YAML). That model is built from scratch and knows nothing of this task until it is shown some play;
# an imperfect teacher leaves RL something to improve.
def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return GridWalkEnv.make_tasks(n, seed, split)


def teacher_move(x: int, y: int, goal: list[int], rng: random.Random, optimal_prob: float) -> str:
    """A move towards the goal with probability `optimal_prob`, else any of the four at random."""
    closer = [m for m, (dx, dy) in MOVES.items()
              if abs(goal[0] - x - dx) + abs(goal[1] - y - dy) < abs(goal[0] - x) + abs(goal[1] - y)]
    return rng.choice(closer) if rng.random() < optimal_prob else rng.choice(list(MOVES))


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float) -> list[Message]:
    """A teacher's episode as chat messages, exactly as GridWalkEnv would play it out."""
    x, y = task["start"]
    goal = task["goal"]
    messages: list[Message] = [{"role": "user", "content": opening(task)}]
    for turn in range(task["turns"]):
        move = teacher_move(x, y, goal, rng, optimal_prob)
        messages.append({"role": "assistant", "content": move})
        x, y = moved(x, y, move, task["size"])
        if [x, y] == goal or turn == task["turns"] - 1:
            break
        messages.append({"role": "user", "content": where(x, y, goal)})
    return messages
