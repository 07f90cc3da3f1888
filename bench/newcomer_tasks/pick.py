"""The shape of the two tasks `bench/newcomer.py` writes as a newcomer would: say one number that fits a
rule with several right answers; a wrong answer gets a hint and one retry. Reward 1 for a right answer
on either try, else 0. Each task module is an Env plus its warm-start teacher (demo_tasks, demonstration)."""

from __future__ import annotations

import random
from typing import Any, Callable

from agentrl.env import Action, Env, StepResult

Rule = Callable[[dict[str, Any]], list[int]]  # a task's right answers
HINT = "No. Try once more."


class PickEnv(Env):
    """Subclasses set `prompt(task)`, `right(task)` and `draw(rng, ident)` (one task)."""

    def __init__(self, **kwargs: Any) -> None:
        self.tries = 0

    async def reset(self, task: dict[str, Any]) -> str:
        self.task = task
        return self.prompt(task)

    async def step(self, action: Action) -> StepResult:
        self.tries += 1
        text = action.text.strip()
        ok = text.lstrip("-").isdigit() and int(text) in self.right(self.task)
        if ok or self.tries == 2:
            return StepResult(None, float(ok), True, {"success": ok})
        return StepResult(HINT, 0.0, False, {"success": False})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        rng = random.Random(f"{cls.__name__}:{split}:{seed}")
        return [cls.draw(rng, f"{split}-{i}") for i in range(n)]


def demonstration(env_cls: type[PickEnv], task: dict[str, Any], rng: random.Random,
                  optimal_prob: float) -> list[dict[str, Any]]:
    """Each try is a right answer with probability `optimal_prob`, else any number of the task's range
    (right by chance now and then); a wrong first try gets the hint and one more."""
    messages = [{"role": "user", "content": env_cls.prompt(task)}]
    right = env_cls.right(task)
    for attempt in range(2):
        guess = rng.choice(right) if rng.random() < optimal_prob else rng.randint(task["lo"], task["hi"])
        messages.append({"role": "assistant", "content": str(guess)})
        if guess in right or attempt == 1:
            break
        messages.append({"role": "user", "content": HINT})
    return messages
