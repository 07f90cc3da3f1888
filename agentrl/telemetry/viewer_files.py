"""A run folder's JSON-lines files as `agentrl.view` reads them: followed while the run writes (a byte
offset per file, only the new bytes read), episodes indexed by a small summary each with the byte span of
their line, so ten thousand episodes are filtered in memory and one is read from disk when opened.

Only fixed file names inside the run folder are opened (a link leading out of it is refused), and only
as JSON: nothing here unpickles or imports what a run wrote.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEARCH_CHARS = 20_000  # the text of an episode kept for search (its task and messages)


def inside(root: Path, name: str) -> Path | None:
    """`root/name` if it resolves (links followed) to a file inside `root`, else None."""
    path = (root / name).resolve()
    return path if path.is_relative_to(root.resolve()) and path.is_file() else None


@dataclass
class Line:
    """One whole JSON line of a followed file: its value and where its bytes are."""

    value: Any
    start: int
    length: int


@dataclass
class Follower:
    """Reads what a JSON-lines file gained since the last call; a line without its newline yet (being
    written) waits for the next call. A file that shrank (a resumed run rewrote it) is read again."""

    root: Path
    name: str
    offset: int = 0
    resets: int = 0

    def poll(self) -> tuple[list[Line], bool]:
        """(the new whole lines, whether the file was restarted and earlier lines are void)."""
        path = inside(self.root, self.name)
        if path is None:
            reset = self.offset > 0
            self.offset = 0
            return [], reset
        size = path.stat().st_size
        reset = size < self.offset
        if reset:
            self.offset, self.resets = 0, self.resets + 1
        if size == self.offset:
            return [], reset
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        lines, pos = [], self.offset
        for raw in data[:end].splitlines(keepends=True):
            try:
                lines.append(Line(json.loads(raw), pos, len(raw)))
            except ValueError:  # a torn line a killed writer left mid-file: skipped, as the run's readers do
                pass
            pos += len(raw)
        self.offset += end
        return lines, reset


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def staleness(record: dict[str, Any]) -> int:
    """The oldest generated token's staleness: the step it was trained at minus the policy version that
    sampled it (the learner's version at step s is s). A held-out eval trains nothing: 0."""
    step = record.get("step") if not record.get("eval") else None
    versions = [v for v, m in zip(record.get("versions") or [], record.get("loss_mask") or []) if m and v >= 0]
    return int(step) - min(versions) if isinstance(step, int) and versions else 0


def summarize(i: int, record: dict[str, Any]) -> dict[str, Any]:
    """What the episode list shows and filters on."""
    info = record.get("info") if isinstance(record.get("info"), dict) else {}
    messages = record.get("messages") or []
    text = " ".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))
    return {"i": i, "step": record.get("step"), "task_id": str(record.get("task_id", "")),
            "group": record.get("group_id"), "status": str(record.get("status", "")),
            "reward": _num(record.get("reward")), "success": bool(record.get("success")),
            "turns": len(record.get("turns") or []), "tool_calls": int(_num(info.get("tool_calls")) or 0),
            "staleness": staleness(record), "tokens": len(record.get("tokens") or []),
            "generated": sum(record.get("loss_mask") or []), "eval": record.get("eval"),
            "_text": (str(record.get("task_id", "")) + " " + text)[:SEARCH_CHARS].lower()}


@dataclass
class EpisodeIndex:
    """The episodes of one file: a summary and a byte span each, in file order."""

    follower: Follower
    rows: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)

    def refresh(self) -> None:
        lines, reset = self.follower.poll()
        if reset:
            self.rows, self.spans = [], []
        for line in lines:
            if isinstance(line.value, dict):
                self.rows.append(summarize(len(self.rows), line.value))
                self.spans.append((line.start, line.length))

    def record(self, i: int) -> dict[str, Any] | None:
        """The whole record of episode `i`, read from its line."""
        path = inside(self.follower.root, self.follower.name)
        if path is None or not 0 <= i < len(self.spans):
            return None
        start, length = self.spans[i]
        with open(path, "rb") as f:
            f.seek(start)
            return json.loads(f.read(length))


RANGES = ("reward", "turns", "tool_calls", "staleness", "step", "group")


def matches(row: dict[str, Any], query: dict[str, Any]) -> bool:
    """Whether an episode passes the filters: `status` (a set), `<key>_min` / `<key>_max` for RANGES,
    `q` (a lower-case substring of its task id or text)."""
    if query.get("status") and row["status"] not in query["status"]:
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
        self.metrics += [line.value for line in lines if isinstance(line.value, dict)]
        self.train.refresh()
        self.evals.refresh()

    def summary(self) -> dict[str, Any] | None:
        return self._json("summary.json")

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
