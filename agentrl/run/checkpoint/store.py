"""The checkpoints of one output folder: atomic writes, the manifest, pruning, and a rollback that
moves the abandoned checkpoints aside instead of deleting them.

A checkpoint is written into `.tmp-step_N`, renamed to `step_N`, and only then is a row appended to
`manifest.jsonl` (flushed and fsynced). A checkpoint counts only once its row is there, so a process
killed at any point of a write leaves the previous checkpoint the newest one. A write that fails (a
full disk, an I/O error) removes its temporary folder and raises CheckpointWriteError; the previous
checkpoints are untouched.

This store changes nothing outside its own `<out_dir>/checkpoints`: a run resumed from another run's
checkpoint reads that folder and nothing more (`agentrl.run.checkpoint.run_state.resolve_resume`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from agentrl.utils import faults
from agentrl.utils.files import atomic_write, read_jsonl

log = logging.getLogger(__name__)

MANIFEST = "manifest.jsonl"
DRIVER_FILE = "driver.json"
LEARNER_DIR = "learner"
ABANDONED = "abandoned-"  # + a UTC time: checkpoints a rollback set aside
# the run's own per-step files, linked into the abandoned folder before the resumed run cuts them back
RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "eval_episodes.jsonl")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (its temporary folder is removed; older ones are intact)."""


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

    def owns(self, folder: str | Path) -> bool:
        """Whether `folder` is one of this store's step folders (symlinks resolved)."""
        return Path(folder).resolve().parent == self.root.resolve()

    def write(self, step: int, fill: Callable[[Path], None]) -> Path:
        """`fill(tmp)` writes the checkpoint's files into an empty temporary folder; then rename and
        manifest row. Blocking (call it from a worker thread); returns the final folder. Any error on
        the way removes the temporary folder and raises CheckpointWriteError naming the cause."""
        tmp, final = self.root / f".tmp-step_{step}", self.root / f"step_{step}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            fill(tmp)
            faults.reached("checkpoint_write")  # every file written; no rename, no manifest row
            if not (tmp / DRIVER_FILE).is_file():
                raise RuntimeError(f"checkpoint {tmp} has no {DRIVER_FILE}")
            _fsync_tree(tmp)
            if final.exists():  # a row-less left-over of a killed write
                _remove(final)
            os.replace(tmp, final)
            _fsync_dir(self.root)
            self._append_row(step, final)  # failing here leaves a row-less step_N: ignored, replaced later
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            kept = self.latest()
            raise CheckpointWriteError(f"checkpoint {final} not written: {type(exc).__name__}: {exc}; "
                                       f"{f'the newest checkpoint is still {kept}' if kept else 'no checkpoint yet'}"
                                       ) from exc
        self._prune()
        return final

    def _append_row(self, step: int, final: Path) -> None:
        manifest = self.root / MANIFEST
        torn = manifest.is_file() and manifest.stat().st_size and _last_byte(manifest) != b"\n"
        with manifest.open("a") as f:  # a row torn by a kill stays on its own line, ignored
            f.write(("\n" if torn else "") + json.dumps({"step": step, "path": final.name, "time": time.time()}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def set_aside_after(self, step: int) -> Path | None:
        """Roll back to `step`: the complete checkpoints newer than it move to
        `checkpoints/abandoned-<UTC time>/` (with links to the run's metrics, rollouts and eval episodes as they were)
        and leave the manifest, so `auto` never jumps forward to them. Nothing is deleted. Returns the
        folder they moved to, or None when there were none."""
        later = [f for f in self.complete() if int(f.name.removeprefix("step_")) > step]
        if not later:
            return None
        aside = self._aside()
        # folders first, then the rows: a kill in between leaves rows without folders, which count for nothing
        for folder in later:
            os.replace(folder, aside / folder.name)
        _fsync_dir(self.root)
        kept = [row for row in self._rows() if row["step"] <= step]
        atomic_write(self.root / MANIFEST, "".join(json.dumps(row) + "\n" for row in kept))
        log.warning("rolled back to step %d: the later checkpoint(s) %s moved to %s (not deleted; remove that "
                    "folder yourself when you no longer need them)", step, ", ".join(f.name for f in later), aside)
        return aside

    def set_aside_run_files(self) -> Path:
        """Before an interrupted run without a checkpoint starts over at step 0: its metrics, rollouts and
        eval episodes as they are, linked into `checkpoints/abandoned-<UTC time>/` (the new run's files
        replace them with new inodes, `restart_jsonl_at`). Returns that folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        aside = self._aside()
        _fsync_dir(self.root)
        return aside

    def _aside(self) -> Path:
        """A new `abandoned-<UTC time>` folder holding links to the run's per-step files as they are."""
        aside = self.root / (ABANDONED + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
        while aside.exists():  # two rollbacks within a second
            aside = aside.with_name(aside.name + "+")
        aside.mkdir()
        for name in RUN_FILES:
            _link_or_copy(self.root.parent / name, aside / name)
        return aside

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        for old in self.complete()[:-self.keep]:
            _remove(old)


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link costs no space, and the file's rewrite for the resumed run (`atomic_write`, a new
    inode) leaves the link's content as it was."""
    if not src.is_file():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _remove(folder: Path) -> None:
    """Rename first, then delete: a kill half-way through never leaves a `step_N` that looks complete
    (its driver file still there) with its learner files gone."""
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
