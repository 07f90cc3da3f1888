"""A run folder's JSON-lines files as `agentrl.view` reads them: followed while the run writes (a byte
offset per file, only the new bytes read), episodes indexed by a small summary each with the byte span of
their line, so ten thousand episodes are filtered in memory and one is read from disk when opened.

A row that is not what the run's writers write (not JSON, not an object, a field of another type: a torn
line a killed writer left mid-file, a hand-edited file) is skipped and counted (`bad_rows`), and the rows
after it are read: what the API serves has the types the page and the filters expect.

Only fixed file names inside the run folder are opened (a link leading out of it is refused), and only
as JSON: nothing here unpickles or imports what a run wrote.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.telemetry.viewer_groups import advantage, mark
from agentrl.utils.files import jsonl_line

SEARCH_CHARS = 20_000  # the text of an episode kept for search (its task and messages)


def inside(root: Path, name: str) -> Path | None:
    """`root/name` if it resolves (links followed) to a file inside `root`, else None."""
    path = (root / name).resolve()
    return path if path.is_relative_to(root.resolve()) and path.is_file() else None


@dataclass
class Line:
    """One whole JSON-object line of a followed file: its value and where its bytes are."""

    value: dict[str, Any]
    start: int
    length: int


@dataclass
class Follower:
    """Reads what a JSON-lines file gained since the last call; a line without its newline yet (being
    written) waits for the next call. A file that shrank (a resumed run rewrote it) is read again.
    `bad`: whole lines since the file's (re)start that are not a JSON object (blank lines aside)."""

    root: Path
    name: str
    offset: int = 0
    resets: int = 0
    bad: int = 0

    def poll(self) -> tuple[list[Line], bool]:
        """(the new whole lines that are JSON objects, whether the file was restarted and earlier lines are void)."""
        path = inside(self.root, self.name)
        if path is None:
            reset = self.offset > 0
            if reset:
                self.offset, self.bad = 0, 0
            return [], reset
        size = path.stat().st_size
        reset = size < self.offset
        if reset:
            self.offset, self.resets, self.bad = 0, self.resets + 1, 0
        if size == self.offset:
            return [], reset
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        lines, pos = [], self.offset
        # Lines end at "\n" only, as agentrl.utils.files reads them (a "\r" is JSON white space).
        for raw in data[:end].split(b"\n")[:-1]:
            line = jsonl_line(0, raw + b"\n")
            if isinstance(line.value, dict):
                lines.append(Line(line.value, pos, len(raw) + 1))
            elif not line.blank:
                self.bad += 1
            pos += len(raw) + 1
        self.offset += end
        return lines, reset


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


class BadRow(ValueError):
    """An episode record with a field of another type than the run's writer gives it."""


def _ints(record: dict[str, Any], key: str) -> list[int]:
    value = record.get(key) or []
    if not (isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise BadRow(f"{key} is not a list of integers")
    return value


def _optional(record: dict[str, Any], key: str, kind: type) -> Any:
    value = record.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise BadRow(f"{key} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _list(record: dict[str, Any], key: str) -> list[Any]:
    value = record.get(key) or []
    if not isinstance(value, list):
        raise BadRow(f"{key} is a {type(value).__name__}, not a list")
    return value


def staleness(record: dict[str, Any]) -> int:
    """The oldest generated token's staleness: the step it was trained at minus the policy version that
    sampled it (the learner's version at step s is s). A held-out eval trains nothing: 0."""
    step = record.get("step") if not record.get("eval") else None
    versions = [v for v, m in zip(_ints(record, "versions"), _ints(record, "loss_mask")) if m and v >= 0]
    return step - min(versions) if isinstance(step, int) and versions else 0


def summarize(i: int, record: dict[str, Any]) -> dict[str, Any]:
    """What the episode list shows and filters on; BadRow when a field has another type than the run's
    writer gives it (the filters compare numbers, the page's colours read per-token lists)."""
    info = record.get("info") if isinstance(record.get("info"), dict) else {}
    text = " ".join(str(m.get("content") or "") for m in _list(record, "messages") if isinstance(m, dict))
    return {"i": i, "step": _optional(record, "step", int), "task_id": str(record.get("task_id", "")),
            "group": _optional(record, "group_id", int), "status": str(record.get("status", "")),
            "reward": _num(record.get("reward")), "success": bool(record.get("success")),
            "turns": len(_list(record, "turns")), "tool_calls": int(_num(info.get("tool_calls")) or 0),
            "staleness": staleness(record), "tokens": len(_list(record, "tokens")),
            "generated": sum(_ints(record, "loss_mask")), "eval": _optional(record, "eval", str),
            "dropped": _optional(record, "dropped", str), "advantage": advantage(record), "equal_rewards": False,
            "_text": (str(record.get("task_id", "")) + " " + text)[:SEARCH_CHARS].lower()}


@dataclass
class EpisodeIndex:
    """The episodes of one file: a summary and a byte span each, in file order."""

    follower: Follower
    rows: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    rejected: int = 0  # JSON objects whose fields summarize refused, since the file's (re)start
    members: dict[tuple, list[int]] = field(default_factory=dict)  # a group's key -> its rows (viewer_groups)

    @property
    def bad_rows(self) -> int:
        return self.follower.bad + self.rejected

    def refresh(self) -> None:
        lines, reset = self.follower.poll()
        if reset:
            self.rows, self.spans, self.rejected, self.members = [], [], 0, {}
        first = len(self.rows)
        for line in lines:
            try:
                row = summarize(len(self.rows), line.value)
            except (BadRow, TypeError, ValueError):  # TypeError, ValueError: a shape BadRow does not name yet
                self.rejected += 1
                continue
            self.rows.append(row)
            self.spans.append((line.start, line.length))
        mark(self.rows, self.members, self.rows[first:])

    def record(self, i: int) -> dict[str, Any] | None:
        """The whole record of episode `i`, read from its line; None when the file no longer holds it
        there (rewritten since the last refresh)."""
        path = inside(self.follower.root, self.follower.name)
        if path is None or not 0 <= i < len(self.spans):
            return None
        start, length = self.spans[i]
        with open(path, "rb") as f:
            f.seek(start)
            value = jsonl_line(0, f.read(length)).value
        return value if isinstance(value, dict) else None


RANGES = ("reward", "turns", "tool_calls", "staleness", "step", "group")
GROUP_KINDS = {"equal": lambda row: row["equal_rewards"], "dropped": lambda row: row["dropped"] is not None}


def matches(row: dict[str, Any], query: dict[str, Any]) -> bool:
    """Whether an episode passes the filters: `status` (a set), `groups` (a GROUP_KINDS key: of a group with
    equal rewards, of a group the dynamic filter dropped), `<key>_min` / `<key>_max` for RANGES, `q` (a
    lower-case substring of its task id or text)."""
    if query.get("status") and row["status"] not in query["status"]:
        return False
    if query.get("groups") and not GROUP_KINDS[query["groups"]](row):
        return False
    for key in RANGES:
        value = row[key]
        low, high = query.get(f"{key}_min"), query.get(f"{key}_max")
        if (low is not None or high is not None) and value is None:
            return False
        if (low is not None and value < low) or (high is not None and value > high):
            return False
    return not query.get("q") or query["q"] in row["_text"]


def page(rows: list[dict[str, Any]], query: dict[str, Any], offset: int, limit: int) -> dict[str, Any]:
    """One page of the episodes passing `query`, with the count of all that pass and of each status."""
    hits = [r for r in rows if matches(r, query)]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    shown = [{k: v for k, v in r.items() if not k.startswith("_")} for r in hits[offset:offset + limit]]
    return {"total": len(hits), "all": len(rows), "offset": offset, "rows": shown, "statuses": statuses}


class RunFiles:
    """Everything `agentrl.view` reads from one run folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.metrics_follower = Follower(self.root, "metrics.jsonl")
        self.metrics: list[dict[str, Any]] = []
        self.train = EpisodeIndex(Follower(self.root, "rollouts.jsonl"))
        self.evals = EpisodeIndex(Follower(self.root, "eval_episodes.jsonl"))

    def refresh(self) -> None:
        """Reads what every file gained since the last call."""
        lines, reset = self.metrics_follower.poll()
        if reset:
            self.metrics = []
        self.metrics += [line.value for line in lines]
        self.train.refresh()
        self.evals.refresh()

    def bad_rows(self) -> dict[str, int]:
        """Rows skipped per file: not JSON objects, or episodes with fields of other types."""
        return {"metrics.jsonl": self.metrics_follower.bad, "rollouts.jsonl": self.train.bad_rows,
                "eval_episodes.jsonl": self.evals.bad_rows}

    def summary(self) -> dict[str, Any] | None:
        return self._json("summary.json")

    def eval_scores(self, summary: dict[str, Any] | None) -> dict[str, float | None]:
        """The held-out score before RL (the warm start's) and after it: summary.json's, else (a running
        run) the mean reward of eval_episodes.jsonl's finished episodes of that label, as
        agentrl.rollout.pool.score_episodes scores them; None where neither holds it."""
        out: dict[str, float | None] = {}
        for label in ("before", "after"):
            score = ((summary or {}).get(f"eval_{label}") or {}).get("score")
            done = [r["reward"] for r in self.evals.rows if r["eval"] == label and r["status"] in ("ok", "truncated")]
            out[label] = _num(score) if _num(score) is not None else (
                sum(x or 0.0 for x in done) / len(done) if done else None)
        return out

    def config(self) -> dict[str, Any] | None:
        """The run's run_config.json (written when training starts, secrets masked), or None; a run of an
        older agentrl wrote it as config.json (a model's config.json has no "train" section)."""
        config = self._json("run_config.json")
        if config is None and "train" in (old := self._json("config.json") or {}):
            return old
        return config

    def _json(self, name: str) -> dict[str, Any] | None:
        path = inside(self.root, name)
        if path is None:
            return None
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:  # both files are written atomically, so only a foreign file
            return None
        return value if isinstance(value, dict) else None

    def index(self, source: str) -> EpisodeIndex | None:
        return {"train": self.train, "eval": self.evals}.get(source)


def eval_ends(files: RunFiles) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The episodes of the first and of the last held-out eval the run recorded (by step, then label)."""
    rows = files.evals.rows
    order = {"before": 0, "during": 1, "after": 2}
    keys = sorted({(r["step"] or 0, order.get(r["eval"], 1)) for r in rows})
    if len(keys) < 2:
        return [], []
    at = lambda key: [r for r in rows if ((r["step"] or 0), order.get(r["eval"], 1)) == key]  # noqa: E731
    return at(keys[0]), at(keys[-1])
