"""Task datasets -> task lists and an endless shuffled training stream.

A task is a JSON object handed to `Env.reset`. Sources: a `.jsonl` file (one task per line) or a
`.json` file (a list of tasks), or, when no path is set, the Env's own `make_tasks` generator.
Every task gets an "id" if it has none, so episodes can be traced back to it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterator

from agentrl.config import DataConfig
from agentrl.env import Env

Task = dict[str, Any]


def read_tasks(path: str | Path, split: str) -> list[Task]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    if path.suffix == ".jsonl":
        tasks = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    tasks.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON: {exc}") from None
    elif path.suffix == ".json":
        tasks = json.loads(path.read_text())
    else:
        raise ValueError(f"{path}: task files must be .jsonl or .json")
    if not tasks or not all(isinstance(t, dict) for t in tasks):
        raise ValueError(f"{path}: expected a non-empty list of JSON objects")
    return [{"id": f"{split}-{i}", **t} for i, t in enumerate(tasks)]


def load_tasks(cfg: DataConfig, env_cls: type[Env]) -> tuple[list[Task], list[Task]]:
    """(train, eval) task lists from files or the Env's generator."""
    def one(path: str | None, n: int, split: str) -> list[Task]:
        if path:
            return read_tasks(path, split)
        return env_cls.make_tasks(n, cfg.seed, split, **cfg.task_kwargs)

    return one(cfg.train_path, cfg.train_tasks, "train"), one(cfg.eval_path, cfg.eval_tasks, "eval")


def task_stream(tasks: list[Task], seed: int) -> Iterator[Task]:
    """Endless stream over `tasks`, reshuffled every epoch."""
    rng = random.Random(seed)
    order = list(tasks)
    while True:
        rng.shuffle(order)
        yield from order
