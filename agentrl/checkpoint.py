"""Resumable checkpoints: `<out_dir>/checkpoints/step_N/`, written atomically, found by a manifest.

A checkpoint is written into a temporary folder, renamed to `step_N`, and only then is a row appended
to `checkpoints/manifest.jsonl` (flushed and fsynced). A checkpoint counts only once its row is
there, so a process killed at any point of a write leaves the previous checkpoint the newest one:
a left-over temporary folder, a renamed folder without a row, or a torn last row are all ignored
(and the temporary folder is cleared by the next write).

    step_N/learner/      the learner's state (`Learner.save_checkpoint`: DeepSpeed engines with their
                         optimizer and scheduler, EMA, KL controller, reward normaliser, version)
    step_N/driver.pkl    the run's asynchronous state (`RunState`): each component's own state dict
                         (buffer: finished groups not yet trained; producer: task cursor and positions
                         in flight; pool: counters; stream), the step, the clock
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from agentrl import faults
from agentrl.files import read_jsonl
from agentrl.types import Group

log = logging.getLogger(__name__)

MANIFEST = "manifest.jsonl"
DRIVER_FILE = "driver.pkl"
LEARNER_DIR = "learner"


class CheckpointError(ValueError):
    """`train.resume` names something that is not a complete checkpoint."""


class Stateful(Protocol):
    """A component a checkpoint holds: it owns its state and puts it back into a fresh instance."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class RunState:
    """What the driver needs to continue a run exactly where a checkpoint left it: the run's own
    counters and each component's `state_dict()` by name (buffer, producer, pool, stream).

    Every task position below `cursor` is, at the instant the state was taken, exactly one of:
    trained (named in a metrics record before `step`), dropped and counted (likewise), finished and
    waiting in `ready`, or in flight (`in_flight`; an Env's state cannot be saved, so those episodes
    restart from their task on resume)."""

    step: int  # learner batches trained; the resumed run continues at this step
    learner_version: int
    components: dict[str, dict[str, Any]]
    elapsed_s: float  # wall-clock seconds of the run so far (all earlier runs included)
    summary: dict[str, Any] = field(default_factory=dict)  # e.g. eval_before, kept for the final summary
    max_staleness_seen: int = 0

    @property
    def cursor(self) -> int:
        """The next new task stream position."""
        return self.components["producer"]["cursor"]

    @property
    def in_flight(self) -> list[int]:
        """Stream positions of admitted groups not yet finished."""
        return self.components["producer"]["in_flight"]

    @property
    def ready(self) -> list[Group]:
        """Finished groups waiting for the learner, with their version stamps."""
        return self.components["buffer"]["ready"]


class CheckpointStore:
    """The checkpoints of one output folder."""

    def __init__(self, out_dir: str | Path, keep: int = 0) -> None:
        self.root = Path(out_dir) / "checkpoints"
        self.keep = keep

    def _rows(self) -> list[dict[str, Any]]:
        path = self.root / MANIFEST
        if not path.is_file():
            return []
        # tolerant: a row cut off by a kill is skipped (that checkpoint never completed)
        return [row for _, row in read_jsonl(path, strict=False)
                if isinstance(row, dict) and isinstance(row.get("step"), int)]

    def complete(self) -> list[Path]:
        """Complete checkpoints still on disk, oldest first."""
        found: dict[int, Path] = {}
        for row in self._rows():
            folder = self.root / f"step_{row['step']}"
            if (folder / DRIVER_FILE).is_file():
                found[row["step"]] = folder
        return [found[s] for s in sorted(found)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def write(self, step: int, fill: Callable[[Path], None]) -> Path:
        """`fill(tmp)` writes the checkpoint's files into an empty temporary folder; then rename and
        manifest row. Blocking (call it from a worker thread); returns the final folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp, final = self.root / f".tmp-step_{step}", self.root / f"step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        fill(tmp)
        faults.reached("checkpoint_write")  # every file written; no rename, no manifest row
        if not (tmp / DRIVER_FILE).is_file():
            raise RuntimeError(f"checkpoint {tmp} has no {DRIVER_FILE}")
        _fsync_tree(tmp)
        if final.exists():  # a row-less left-over of a killed write, or a step re-run after a resume
            _remove(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        manifest = self.root / MANIFEST
        torn = manifest.is_file() and manifest.stat().st_size and _last_byte(manifest) != b"\n"
        with manifest.open("a") as f:  # a row torn by a kill stays on its own line, ignored
            f.write(("\n" if torn else "") + json.dumps({"step": step, "path": final.name, "time": time.time()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._prune()
        return final

    def discard_after(self, step: int) -> None:
        """Remove the checkpoints newer than `step`: a run resumed from an older one abandons them
        (`auto` must never jump forward to them)."""
        for folder in self.complete():
            if int(folder.name.removeprefix("step_")) > step:
                _remove(folder)

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        for old in self.complete()[:-self.keep]:
            _remove(old)


def capture(step: int, learner_version: int, components: dict[str, Stateful], elapsed_s: float,
            summary: dict[str, Any], max_staleness_seen: int) -> RunState:
    """The run's asynchronous state at this instant. Synchronous (no await), so no group can finish,
    and no position move, between the components' states; each copies what it hands over."""
    states = {name: part.state_dict() for name, part in components.items()}
    if "producer" in states and "buffer" in states:
        producer, buffer = len(states["producer"]["in_flight"]), states["buffer"]["in_flight"]
        if producer != buffer:
            raise RuntimeError(f"checkpoint: the producer has {producer} groups in flight, the buffer {buffer}")
    return RunState(step, learner_version, states, elapsed_s, copy.deepcopy(summary), max_staleness_seen)


def restore(state: RunState, components: dict[str, Stateful]) -> None:
    """Put `state` back into freshly built components (before the producer runs)."""
    for name, part in components.items():
        part.load_state_dict(state.components[name])


def save_run_state(folder: Path, state: RunState) -> None:
    with (folder / DRIVER_FILE).open("wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)


def load_run_state(folder: str | Path) -> RunState:
    with (Path(folder) / DRIVER_FILE).open("rb") as f:
        return pickle.load(f)


def resolve_resume(resume: str | None, out_dir: str | Path) -> Path | None:
    """The checkpoint folder to resume from: None for a fresh run (`resume` unset, or 'auto' with no
    complete checkpoint in out_dir); a CheckpointError when a named folder is not a complete one."""
    if resume is None:
        return None
    if resume == "auto":
        return CheckpointStore(out_dir).latest()
    folder = Path(resume).expanduser()
    if not (folder / DRIVER_FILE).is_file() or not (folder / LEARNER_DIR).is_dir():
        raise CheckpointError(f"train.resume={resume!r}: not a complete checkpoint folder (one holds "
                              f"{DRIVER_FILE} and {LEARNER_DIR}/; they are under <out_dir>/checkpoints/step_N)")
    store = CheckpointStore(folder.parent.parent)
    if folder.resolve() not in [p.resolve() for p in store.complete()]:
        raise CheckpointError(f"train.resume={resume!r}: this checkpoint has no row in "
                              f"{folder.parent / MANIFEST}; it was cut off mid-write")
    return folder


def audit(out_dir: str | Path) -> dict[str, Any]:
    """Account for every task position of a finished (or stopped) run from its metrics records and
    its newest checkpoint: each position below the checkpoint's cursor should appear exactly once,
    as trained, dropped (by reason), or waiting/in flight in that checkpoint."""
    from agentrl.metrics import read_metrics

    out_dir = Path(out_dir)
    latest = CheckpointStore(out_dir).latest()
    if latest is None:
        raise FileNotFoundError(f"{out_dir}: no complete checkpoint to audit against")
    state = load_run_state(latest)
    records = [r for r in read_metrics(out_dir / "metrics.jsonl") if r["step"] < state.step]
    trained = [p for r in records for p in r.get("tasks/trained", [])]
    dropped = [p for r in records for ids in r.get("tasks/dropped", {}).values() for p in ids]
    pending = [g.group_id for g in state.ready] + list(state.in_flight)
    seen: dict[int, int] = {}
    for p in trained + dropped + pending:
        seen[p] = seen.get(p, 0) + 1
    return {
        "checkpoint": str(latest), "steps": [r["step"] for r in records], "cursor": state.cursor,
        "trained": len(trained), "dropped": len(dropped), "pending": len(pending),
        "skipped": [p for p in range(state.cursor) if p not in seen],
        "duplicated": sorted(p for p, n in seen.items() if n > 1),
        "max_trained_staleness": max((r["trained_staleness_max"] for r in records), default=0),
    }


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _remove(folder: Path) -> None:
    """Rename first, then delete: a kill half-way through never leaves a `step_N` that looks complete
    (driver.pkl still there) with its learner files gone."""
    trash = folder.with_name(f".trash-{folder.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
