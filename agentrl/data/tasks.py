"""Task datasets -> task lists and an endless shuffled training stream.

A task is a JSON object handed to `Env.reset`. Sources: a `.jsonl` file (one task per line) or a
`.json` file (a list of tasks), or, when no path is set, the Env's own `make_tasks` generator.
Every task gets an "id" if it has none, so episodes can be traced back to it.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any, Iterator

from agentrl.config import DataConfig
from agentrl.data.errors import DataError
from agentrl.utils.files import JsonlError, read_jsonl
from agentrl.env import Env

log = logging.getLogger(__name__)

Task = dict[str, Any]


def _row(value: Any, where: str) -> Task:
    if not isinstance(value, dict):
        raise DataError(f"{where}: expected a JSON object (one task), got {type(value).__name__}")
    return value


def read_tasks(path: str | Path, split: str, key: str = "data.train_path") -> list[Task]:
    """Tasks of a .jsonl (one object per line) or .json (a list of objects) file; `key` is the config
    key that named the file, for error messages."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{key}: task file {path} does not exist")
    if path.suffix == ".jsonl":
        try:
            tasks = [_row(value, f"{key}: {path} line {number}") for number, value in read_jsonl(path)]
        except JsonlError as exc:
            raise DataError(f"{key}: {path} line {exc.line}: {exc.what}") from None
    elif path.suffix == ".json":
        try:
            rows = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DataError(f"{key}: {path} line {exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(rows, list):
            raise DataError(f"{key}: {path}: expected a JSON list of tasks, got {type(rows).__name__}")
        tasks = [_row(t, f"{key}: {path} item {i}") for i, t in enumerate(rows)]
    else:
        raise DataError(f"{key}: {path}: task files must be .jsonl or .json")
    if not tasks:
        raise DataError(f"{key}: {path} holds no tasks")
    return [{"id": f"{split}-{i}", **t} for i, t in enumerate(tasks)]


def load_tasks(cfg: DataConfig, env_cls: type[Env]) -> tuple[list[Task], list[Task]]:
    """(train, eval) task lists from files or the Env's generator."""
    def one(path: str | None, n: int, split: str) -> list[Task]:
        if path:
            return read_tasks(path, split, f"data.{split}_path")
        return env_cls.make_tasks(n, cfg.seed, split, **cfg.task_kwargs)

    return one(cfg.train_path, cfg.train_tasks, "train"), one(cfg.eval_path, cfg.eval_tasks, "eval")


class TaskStream:
    """The endless training stream as a function of position: position p is the (p mod n)-th task of
    epoch p // n's shuffle, seeded by (seed, epoch). A run's place in the stream is one number (the
    checkpoint's task cursor), and a task in flight when a run was killed is re-issued by its position."""

    def __init__(self, tasks: list[Any], seed: int) -> None:
        if not tasks:
            raise ValueError("a task stream needs at least one task")
        self.tasks, self.seed = list(tasks), seed
        self._epoch, self._order = -1, list(range(len(self.tasks)))

    def __getitem__(self, position: int) -> Any:
        if position < 0:
            raise IndexError(f"stream position {position} < 0")
        epoch, offset = divmod(position, len(self.tasks))
        if epoch != self._epoch:  # positions are mostly read in order: one shuffle per epoch
            self._order = list(range(len(self.tasks)))
            random.Random(f"{self.seed}/{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self.tasks[self._order[offset]]

    def state_dict(self) -> dict[str, Any]:
        """Position p's task follows from the seed and the task count alone: the stream keeps no cursor
        (the producer's is the run's place); these two tell whether a resumed run reads the same stream."""
        return {"seed": self.seed, "tasks": len(self.tasks)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        now = self.state_dict()
        if state != now:
            log.warning("the task stream differs from the checkpoint's (%s now, %s then): resumed positions "
                        "map to other tasks", now, state)

    def __iter__(self) -> Iterator[Any]:
        position = 0
        while True:
            yield self[position]
            position += 1


def task_stream(tasks: list[Any], seed: int) -> Iterator[Any]:
    """Endless stream over `tasks`, reshuffled every epoch (`TaskStream` from position 0)."""
    return iter(TaskStream(tasks, seed))


def read_texts(path: str | Path) -> list[str]:
    """Unsupervised text: a .txt file (one text per line) or .jsonl with a "text" field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"text file {path} does not exist")
    if path.suffix == ".jsonl":
        lines = []
        for number, row in read_jsonl(path):  # JsonlError (a ValueError) names file and line
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{number}: expected an object with a string 'text' field")
            lines.append(row["text"])
    elif path.suffix == ".txt":
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"{path}: text files must be .txt or .jsonl")
    if not lines:
        raise ValueError(f"{path}: no texts")
    return lines


def lm_batches(path: str | Path, tokenizer: Any, batch_size: int, max_len: int, seed: int) -> Iterator[tuple]:
    """Endless (input_ids, attention_mask) batches of right-padded texts, reshuffled every epoch, for the
    learner's unsupervised LM loss."""
    from agentrl.utils.padding import pad_tokens  # torch: only runs with an LM loss import it

    rows = [tokenizer(text, add_special_tokens=False)["input_ids"][:max_len] for text in read_texts(path)]
    rows = [r for r in rows if len(r) >= 2]
    if not rows:
        raise ValueError(f"{path}: every text is shorter than 2 tokens")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stream = task_stream(rows, seed)
    while True:
        batch = [next(stream) for _ in range(batch_size)]
        yield pad_tokens(batch, pad)
