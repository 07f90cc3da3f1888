"""Which folder an RL run writes to and which checkpoint it continues from, decided at start-up from
what `train.out_dir` and its numbered siblings hold (`agentrl.utils.outputs`), so that a command typed
twice never writes into another run's files (docs/durability.md, "Running a command again"):

- a fresh run (no `train.resume`) writes to `train.out_dir` if no run is there, else to the next free
  `<out_dir>-N` (logged, and printed in the summary);
- `train.resume=auto` continues the newest run of that family (`<out_dir>`, `-2`, `-3`, ...) in its own
  folder: from its newest complete checkpoint; an interrupted run with none starts over in place, its
  earlier files set aside first; a finished run with none is not continued (a fresh run, numbered);
- `train.resume=<checkpoint>` of the out_dir's own run rolls back in place; any other checkpoint (another
  run's, or one set aside in `checkpoints/abandoned-<T>/`) starts a branch in a free folder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agentrl.run.checkpoint.run_state import resolve_resume
from agentrl.run.checkpoint.store import CheckpointStore
from agentrl.utils.outputs import claim_folder, newest_run, release_folder, run_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlace:
    """Where a run writes and what it continues from."""

    out_dir: Path  # the folder asked for (train.out_dir), or the run that train.resume=auto continues
    resume: Path | None  # the checkpoint folder the run continues from
    fresh: bool  # a folder of its own is taken at start (`claim_run`); else the run continues in out_dir
    restart: bool = False  # auto on an interrupted run without checkpoint: its files set aside, step 0
    why: str = ""  # what start-up says when the folder taken differs from out_dir


def place_run(resume: str | None, out_dir: str | Path) -> RunPlace:
    """Reads folders only (CheckpointError for a checkpoint that cannot be resumed)."""
    out = Path(out_dir).expanduser()
    if resume == "auto":
        target = newest_run(out) or out
        checkpoint = resolve_resume("auto", target)
        if checkpoint is not None:
            return RunPlace(target, checkpoint, fresh=False)
        found = run_files(target)
        if not found:
            return RunPlace(out, None, fresh=True)
        if "summary.json" in found:  # finished, and nothing to continue it from
            return RunPlace(out, None, fresh=True, why=f"train.resume=auto: {target} holds a finished run "
                            f"without a checkpoint, which cannot be continued; a fresh run starts")
        return RunPlace(target, None, fresh=False, restart=True)
    checkpoint = resolve_resume(resume, out)
    if checkpoint is not None and CheckpointStore(out).owns(checkpoint):
        return RunPlace(out, checkpoint, fresh=False)
    why = "" if checkpoint is None else f"train.resume={resume}: a branch of that run starts"
    return RunPlace(out, checkpoint, fresh=True, why=why)


def claim_run(place: RunPlace) -> Path:
    """The folder the run writes to, taken now (just before the engines start). A fresh run's is
    created with this process's claim; an interrupted run that starts over has its files set aside."""
    if place.restart:
        aside = CheckpointStore(place.out_dir).set_aside_run_files()
        log.warning("train.resume=auto: %s has no complete checkpoint; the run starts over at step 0 (its "
                    "earlier files are kept in %s)", place.out_dir, aside)
        return place.out_dir
    if not place.fresh:
        return place.out_dir
    folder = claim_folder(place.out_dir)
    if folder != place.out_dir:
        held = ", ".join(f for f in run_files(place.out_dir) if not f.startswith(".")) or "a run"
        lead = f"{place.why}; " if place.why else ""
        log.warning("%strain.out_dir=%s already holds a run (%s), which is kept as it is: this run writes to %s "
                    "(train.resume=auto continues the newest run of %s)", lead, place.out_dir, held, folder,
                    place.out_dir)
    elif place.why:
        log.info("%s in %s", place.why, folder)
    return folder


def release_run(place: RunPlace, folder: Path) -> None:
    """A fresh run that stopped at a config error before writing anything leaves no folder behind (the
    claim `claim_run` took is given back); a continued run's folder is its own and stays."""
    if place.fresh:
        release_folder(folder)
