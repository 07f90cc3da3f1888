"""A newcomer's task: an even number from lo to hi (half the range is right)."""

from __future__ import annotations

import random
from typing import Any

from bench.newcomer_tasks import pick


class EvenEnv(pick.PickEnv):
    @staticmethod
    def prompt(task: dict[str, Any]) -> str:
        return f"Say an even number from {task['lo']} to {task['hi']}."

    @staticmethod
    def right(task: dict[str, Any]) -> list[int]:
        return [k for k in range(task["lo"], task["hi"] + 1) if k % 2 == 0]

    @staticmethod
    def draw(rng: random.Random, ident: str) -> dict[str, Any]:
        lo = rng.randint(1, 40)
        return {"id": ident, "lo": lo, "hi": lo + rng.randint(3, 12)}


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    return EvenEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float) -> list[dict[str, Any]]:
    return pick.demonstration(EvenEnv, task, rng, optimal_prob)
