"""Trained episodes as JSON lines: one record per episode, written by the training loop when
`train.save_rollouts` is set, read back by `agentrl.replay` (and anything else: it is plain JSON).

A record is `episode_to_record(ep, step, task)`: the step it was trained at, its task, and every
Episode field (the token ledger, behaviour logprobs, versions, turns, reward, status, info).
`episode_from_record` is its inverse for what JSON keeps; JSON does not keep:

  * non-finite floats (NaN, +-inf), written as null: a null logprob or reward comes back as NaN,
    elsewhere (info) it stays None;
  * dict keys that are not strings (they come back as strings), tuples (lists);
  * objects json cannot encode: arrays and tensors become lists (`.tolist()`), anything else its repr().

The file is append-only during a run. A resumed run continuing at step s keeps the rows of steps < s
and drops the rest (rows written after the checkpoint it resumes from, and a line torn by a crash),
so every step appears once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from agentrl.data import DataError
from agentrl.utils.files import JsonlError, read_jsonl, restart_jsonl_at
from agentrl.types import Episode, Group, Segment, Turn

log = logging.getLogger(__name__)

# Keys every record must have for `episode_from_record` (the rest have Episode's defaults).
REQUIRED = ("task_id", "group_id", "tokens", "loss_mask", "logprobs", "versions", "reward", "status")


def jsonable(value: Any) -> Any:
    """`value` with only what JSON encodes exactly: non-finite floats -> None, tuples -> lists,
    keys -> str; arrays/tensors -> lists; any other object -> its repr() (readable, not reversible)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return jsonable(value.tolist())
    return repr(value)


def episode_to_record(ep: Episode, step: int | None = None, task: dict | None = None) -> dict[str, Any]:
    """A JSON-safe dict of one episode; `task` defaults to the one the rollout kept in `ep.info`."""
    return jsonable({
        "task_id": ep.task_id, "group_id": ep.group_id, "step": step,
        "task": task if task is not None else ep.info.get("task"),
        "messages": ep.messages, "tokens": ep.tokens, "loss_mask": ep.loss_mask, "logprobs": ep.logprobs,
        "versions": ep.versions, "prompt_len": ep.prompt_len, "reward": ep.reward, "status": ep.status,
        "error": ep.error, "success": ep.success, "turns": [dataclasses.asdict(t) for t in ep.turns],
        "info": ep.info, "segments": [dataclasses.asdict(seg) for seg in ep.segments],
    })


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def episode_from_record(d: dict[str, Any]) -> Episode:
    """The Episode a record was written from (see the module docstring for what JSON loses)."""
    return Episode(
        task_id=d["task_id"], group_id=int(d["group_id"]), tokens=list(d["tokens"]),
        loss_mask=list(d["loss_mask"]), logprobs=[_float(x) for x in d["logprobs"]],
        versions=list(d["versions"]), prompt_len=int(d.get("prompt_len", 0)), reward=_float(d["reward"]),
        status=d["status"], error=d.get("error", ""), turns=[Turn(**t) for t in d.get("turns", [])],
        messages=list(d.get("messages", [])), info=dict(d.get("info") or {}), success=bool(d.get("success")),
        segments=[Segment(**seg) for seg in d.get("segments", [])])


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a rollouts file; a DataError names the file and line of a bad one."""
    records = []
    try:
        for number, record in read_jsonl(path):
            _check_record(path, number, record)
            records.append(record)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    except JsonlError as exc:
        raise DataError(f"{path}:{exc.line}: not a JSON record ({exc.detail})") from None
    return records


def _check_record(path: str | os.PathLike, number: int, record: Any) -> None:
    if not isinstance(record, dict):
        raise DataError(f"{path}:{number}: a record must be a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise DataError(f"{path}:{number}: record has no {missing[0]!r} key")


class RolloutWriter:
    """Appends one record per trained episode to a JSON-lines file, one flush per step."""

    def __init__(self, path: str | os.PathLike, start_step: int = 0) -> None:
        """`start_step` 0: a fresh run (the file is emptied). > 0: a run resumed at that step keeps
        the rows of earlier steps and drops later ones and a torn last line."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dropped = restart_jsonl_at(self.path, start_step)
        if dropped:
            log.info("%s: dropped %d rows of steps >= %d (or torn)", self.path, dropped, start_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, groups: list[Group]) -> None:
        lines = [json.dumps(episode_to_record(ep, step, g.task), allow_nan=False, ensure_ascii=False)
                 for g in groups for ep in g.episodes]
        self._file.write("".join(line + "\n" for line in lines))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
