"""Multi-turn default task: find a hidden integer from "Higher." / "Lower." replies.

The model must use the feedback of earlier turns: a policy that ignores it rarely succeeds within
`max_turns`, while bisection always does (ceil(log2(high - low + 2)) guesses suffice).
Reward is 1.0 when the number is found, else 0.0; `turn_penalty` takes that much off per extra turn
(found at turn t: max(0, 1 - turn_penalty * (t - 1))), so a score also measures how fast it was found.
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentrl.env import Action, Env, Message, StepResult

_INT_RE = re.compile(r"-?\d+")


def prompt_text(low: int, high: int) -> str:
    return f"Guess my number from {low} to {high}."


class GuessNumberEnv(Env):
    def __init__(self, max_turns: int = 4, turn_penalty: float = 0.0) -> None:
        self.max_turns, self.turn_penalty = max_turns, turn_penalty
        self.turn = 0
        self.task: dict[str, Any] = {}

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task, self.turn = task, 0
        return [{"role": "user", "content": prompt_text(task["low"], task["high"])}]

    async def step(self, action: Action) -> StepResult:
        self.turn += 1
        out_of_turns = self.turn >= self.max_turns
        match = _INT_RE.fullmatch(action.text.strip())
        if match is None:
            return StepResult("Reply with one number.", 0.0, out_of_turns, {"success": False, "valid": False})
        guess, target = int(match.group()), self.task["target"]
        if guess == target:
            reward = max(0.0, 1.0 - self.turn_penalty * (self.turn - 1))
            return StepResult(None, reward, True, {"success": True, "turns": self.turn})
        feedback = "Higher." if guess < target else "Lower."
        return StepResult(feedback, 0.0, out_of_turns, {"success": False})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, low: int = 1, high: int = 15) -> list[dict[str, Any]]:
        # Different splits draw from independent streams, so eval tasks are never the train stream.
        rng = random.Random(f"{split}:{seed}")
        return [{"id": f"{split}-{i}", "low": low, "high": high, "target": rng.randint(low, high)}
                for i in range(n)]


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Tasks for the embedded default model's warm start (`model.default.task: guess_number`)."""
    return GuessNumberEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float,
                  max_turns: int = 4) -> list[Message]:
    """A teacher episode: each guess is the bisection midpoint with probability `optimal_prob`,
    otherwise a uniform guess among the numbers still consistent with the feedback. The teacher is
    deliberately imperfect so that RL has something to improve."""
    lo, hi, target = task["low"], task["high"], task["target"]
    messages: list[Message] = [{"role": "user", "content": prompt_text(lo, hi)}]
    for turn in range(max_turns):
        guess = (lo + hi) // 2 if rng.random() < optimal_prob else rng.randint(lo, hi)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == target or turn == max_turns - 1:
            break
        if guess < target:
            lo = guess + 1
            messages.append({"role": "user", "content": "Higher."})
        else:
            hi = guess - 1
            messages.append({"role": "user", "content": "Lower."})
    return messages


def preference_pairs(n: int, seed: int, split: str = "preferences",
                     max_turns: int = 4) -> list[tuple[list[Message], list[Message]]]:
    """`n` (chosen, rejected) episodes for reward-model training, one hidden number per pair: chosen
    finds it (the env's reward 1), rejected runs out of turns (reward 0). Both are `demonstration`s
    with a teacher strength drawn per attempt, sampled until each kind has turned up, so turn count
    alone does not separate them: a chosen episode can also take all `max_turns` guesses.
    The messages are what `rollout` records in `episode.messages`, which a reward model scores."""
    rng = random.Random(f"{split}:{seed}:pairs")
    pairs = []
    for task in GuessNumberEnv.make_tasks(n, seed, split):
        found: dict[bool, list[Message]] = {}
        while len(found) < 2:
            messages = demonstration(task, rng, rng.random(), max_turns)
            found.setdefault(messages[-1]["content"] == str(task["target"]), messages)
        pairs.append((found[True], found[False]))
    return pairs
