"""A newcomer's task: a number from lo to hi that k divides (two to five right answers)."""

from __future__ import annotations

import random
from typing import Any

from bench.newcomer_tasks import pick


class DivisibleEnv(pick.PickEnv):
    @staticmethod
    def prompt(task: dict[str, Any]) -> str:
        return f"Say a number from {task['lo']} to {task['hi']} that {task['k']} divides."

    @staticmethod
    def right(task: dict[str, Any]) -> list[int]:
        return [m for m in range(task["lo"], task["hi"] + 1) if m % task["k"] == 0]

    @staticmethod
    def draw(rng: random.Random, ident: str) -> dict[str, Any]:
        k = rng.randint(3, 7)
        lo = rng.randint(1, 50)
        return {"id": ident, "lo": lo, "hi": lo + k * rng.randint(2, 5) - 1, "k": k}


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return DivisibleEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float) -> list[dict[str, Any]]:
    return pick.demonstration(DivisibleEnv, task, rng, optimal_prob)
