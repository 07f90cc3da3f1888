"""Trained episodes as JSON lines: one record per episode, written by the training loop as
`train.save_rollouts` says (a sample of each step's groups up to a cap on disk, by default), read back by
`agentrl.view`, `agentrl.replay` (and anything else: it is plain JSON).

A record is `episode_to_record(ep, step, task)`: the step it was trained at, its task, and every
Episode field (the token ledger, behaviour logprobs, versions, turns, reward, status, info). The run's
writer adds `token_text` (each token decoded on its own: a byte-level token that is part of a character
reads as U+FFFD), in eval_episodes.jsonl `eval` (before, during or after RL), and on the episodes of a
group the run dropped instead of training it `dropped` (its reason: "filtered", no reward spread under
`algo.dynamic_filter`; "stale", past `buffer.max_staleness` when its batch was assembled; `write_dropped`).
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
import random
from collections.abc import Callable
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
    # per row, when a teacher engine scored it (algo.teacher); absent otherwise
    teacher = {} if ep.teacher_logprobs is None else {"teacher_logprobs": ep.teacher_logprobs}
    return jsonable({
        "task_id": ep.task_id, "group_id": ep.group_id, "step": step,
        "task": task if task is not None else ep.info.get("task"),
        "messages": ep.messages, "tokens": ep.tokens, "loss_mask": ep.loss_mask, "logprobs": ep.logprobs,
        "versions": ep.versions, "prompt_len": ep.prompt_len, "reward": ep.reward, "status": ep.status,
        "error": ep.error, "traceback": ep.traceback, "sample": ep.sample, "success": ep.success,
        "turns": [dataclasses.asdict(t) for t in ep.turns],
        "info": ep.info, "segments": [dataclasses.asdict(seg) for seg in ep.segments],
        **teacher,
    })


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def episode_from_record(d: dict[str, Any]) -> Episode:
    """The Episode a record was written from (see the module docstring for what JSON loses)."""
    return Episode(
        task_id=d["task_id"], group_id=int(d["group_id"]), tokens=list(d["tokens"]),
        loss_mask=list(d["loss_mask"]), logprobs=[_float(x) for x in d["logprobs"]],
        versions=list(d["versions"]), prompt_len=int(d.get("prompt_len", 0)), reward=_float(d["reward"]),
        status=d["status"], error=d.get("error", ""), traceback=d.get("traceback", ""),
        sample=int(d.get("sample", 0)), turns=[Turn(**t) for t in d.get("turns", [])],
        messages=list(d.get("messages", [])), info=dict(d.get("info") or {}), success=bool(d.get("success")),
        segments=[Segment(**seg) for seg in d.get("segments", [])],
        teacher_logprobs=None if d.get("teacher_logprobs") is None else
        [[_float(x) for x in row] for row in d["teacher_logprobs"]])


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


def learner_values(trained: list[Episode], token_values: dict[str, Any]) -> dict[int, dict[str, list]]:
    """id(episode) -> {name: per-token list over its current ledger} from the learner's (B, T) tensors, whose
    rows are the episodes' `rows()` in order (`TrainBatch.from_episodes`): an episode's current ledger is its
    last row. Rounded to 4 decimals (a colour and a hover, not a replay; an integer tensor, such as the
    learner's `cause` codes, stays integers); None where not scored."""
    out: dict[int, dict[str, list]] = {}
    row = 0
    as_value = {name: (lambda v: round(float(v), 4)) if t.is_floating_point() else int
                for name, t in token_values.items() if t is not None}
    for ep in trained:
        row += len(ep.rows())
        out[id(ep)] = {name: [as_value[name](v) if m else None for v, m in zip(t[row - 1, :len(ep.tokens)].tolist(),
                                                                             ep.loss_mask)]
                       for name, t in token_values.items() if t is not None}
    return out


class RolloutWriter:
    """Appends one record per written episode to a JSON-lines file, one flush per step: a seeded random
    sample of `sample_groups` groups per step (None = all), until the file holds `max_bytes` (0 = no cap)."""

    def __init__(self, path: str | os.PathLike, start_step: int = 0, sample_groups: int | None = None,
                 max_bytes: int = 0, decode: Callable[[list[int]], list[str]] | None = None,
                 seed: int = 0) -> None:
        """`start_step` 0: a fresh run (the file is emptied). > 0: a run resumed at that step keeps
        the rows of earlier steps and drops later ones and a torn last line."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dropped = restart_jsonl_at(self.path, start_step)
        if dropped:
            log.info("%s: dropped %d rows of steps >= %d (or torn)", self.path, dropped, start_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self.sample_groups, self.max_bytes, self.decode, self.seed = sample_groups, max_bytes, decode, seed
        self.size = self.path.stat().st_size
        self.full = False
        self._text: dict[int, str] = {}  # token id -> its text: each id decoded once a run

    def _sample(self, step: int, groups: list[Group]) -> list[Group]:
        """Random, not the first N: a batch's groups come in the order they finished, shortest first."""
        if self.sample_groups is None or self.sample_groups >= len(groups):
            return groups
        keep = set(random.Random(self.seed * 1_000_003 + step).sample(range(len(groups)), self.sample_groups))
        return [g for i, g in enumerate(groups) if i in keep]

    def _record(self, ep: Episode, step: int, task: dict | None, extra: dict[str, Any]) -> str:
        record = episode_to_record(ep, step, task)
        if self.decode is not None:
            missing = sorted(set(ep.tokens).difference(self._text))
            self._text.update(zip(missing, self.decode(missing) if missing else []))
            record["token_text"] = [self._text[t] for t in ep.tokens]
        record.update(extra)
        return json.dumps(record, allow_nan=False, ensure_ascii=False)

    def write(self, step: int, groups: list[Group], trained: list[Episode] | None = None,
              token_values: dict[str, Any] | None = None) -> None:
        """A sample of the step's groups. `trained`, `token_values`: the batch's episodes in row order and the
        learner's (B, T) per-token values (`StepMetrics.token_values`), written beside each trained episode's
        current ledger (`learner_values`); an episode the batch left out (a failure) has none."""
        values = learner_values(trained or [], token_values or {})
        self._write([self._record(ep, step, g.task, values.get(id(ep), {}))
                     for g in self._sample(step, groups) for ep in g.episodes])

    def write_dropped(self, step: int, groups: list[Group], reason: str) -> None:
        """Groups dropped at this step instead of trained (`reason`: "filtered" or "stale"), sampled as `write` samples,
        each episode flagged `dropped: reason`; no learner values (nothing of them was trained)."""
        self._write([self._record(ep, step, g.task, {"dropped": reason})
                     for g in self._sample(step, groups) for ep in g.episodes])

    def write_eval(self, step: int, label: str, episodes: list[Episode]) -> None:
        """A held-out evaluation's episodes (`label`: before, during or after RL), all of them."""
        self._write([self._record(ep, step, None, {"eval": label}) for ep in episodes])

    def _write(self, lines: list[str]) -> None:
        if self.full or not lines:
            return
        text = "".join(line + "\n" for line in lines)
        size = len(text.encode("utf-8"))
        if self.max_bytes and self.size + size > self.max_bytes:
            self.full = True
            log.info("%s holds %.2f MB, the cap of train.save_rollouts.max_mb: no more episodes are written "
                     "to it this run", self.path, self.size / 2**20)
            return
        self._file.write(text)
        self._file.flush()
        self.size += size

    def close(self) -> None:
        self._file.close()


def run_writers(section: Any, out_dir: str, start_step: int, seed: int,
                decode: Callable[[list[int]], list[str]] | None) -> tuple[RolloutWriter | None, RolloutWriter | None]:
    """The writers of rollouts.jsonl and eval_episodes.jsonl that `train.save_rollouts` (`section`) asks
    for, or None each."""
    groups = None if section.sample_groups == "all" else section.sample_groups
    cap = int(section.max_mb * 2**20)
    train = RolloutWriter(os.path.join(out_dir, "rollouts.jsonl"), start_step, groups, cap, decode, seed) \
        if groups != 0 else None
    evals = RolloutWriter(os.path.join(out_dir, "eval_episodes.jsonl"), start_step, None, cap, decode, seed) \
        if section.eval else None
    return train, evals
