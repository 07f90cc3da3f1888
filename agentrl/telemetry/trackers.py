"""The extra metric sinks of `train.loggers` next to metrics.jsonl: TensorBoard event files and a wandb run.

Each gets the record's finite scalars (`flat_scalars`) with the learner step. A resumed run continues
where its checkpoint left off: TensorBoard's `purge_step` hides the events a killed run wrote past the
checkpoint (and with start_step 0 all events of an earlier run in the folder), and wandb reuses the run
id kept in `<out_dir>/wandb_run_id`.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agentrl.config.load import ConfigError
from agentrl.config.secrets import masked

# logger name -> (module imported, the install that provides it: scripts/install.sh's extra, or a pip requirement
# for what the main install has)
PACKAGES = {"tensorboard": ("torch.utils.tensorboard", "pip install 'tensorboard>=2.16'"),
            "wandb": ("wandb", "./scripts/install.sh wandb")}
# Plotted on the x axis by every sink already; as a series it would be a diagonal line.
NOT_SCALARS = frozenset({"step"})


class Tracker(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self, ok: bool) -> None:
        """`ok` is False when the run stops without its summary (an error or a kill)."""


def _scalar(value: Any) -> float | None:
    # bool is an int subclass; numbers.Real also takes numpy scalars.
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value)
    return None


def flat_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number of a record, dict values flattened one level as `key/subkey`."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in NOT_SCALARS:
            continue
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for sub, item in items:
            if (x := _scalar(item)) is not None:
                out[key if sub is None else f"{key}/{sub}"] = x
    return out


def check_available(loggers: Iterable[str]) -> None:
    """Start-up's check (before any engine starts) that each sink's package is installed, without
    importing it; a ConfigError naming `train.loggers` and the pip requirement otherwise."""
    from importlib.util import find_spec

    for logger in loggers:
        # torch.utils.tensorboard is always there; the `tensorboard` package it writes with may not be
        if logger in PACKAGES and find_spec(logger) is None:
            raise ConfigError(f"train.loggers has {logger!r} but {logger} is not installed: run {PACKAGES[logger][1]}")


def _import(logger: str) -> Any:
    module, requirement = PACKAGES[logger]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"train.loggers has {logger!r} but {module} cannot be imported ({exc}); "
                          f"run {requirement} or take {logger!r} out of train.loggers") from exc


class TensorBoardTracker:
    def __init__(self, module: Any, out_dir: Path, start_step: int) -> None:
        # purge_step: TensorBoard hides the events at steps >= start_step that earlier writers left in this
        # folder: a resumed run's past the checkpoint, or with 0 all of an earlier run's, as metrics.jsonl.
        self.writer = module.SummaryWriter(log_dir=str(out_dir / "tensorboard"), purge_step=start_step)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step, walltime=None)
        self.writer.flush()  # a killed run keeps every step it logged

    def close(self, ok: bool) -> None:
        self.writer.close()


def wandb_mode(env: Mapping[str, str]) -> str:
    """WANDB_MODE when set; else online with an API key, offline without (no login prompt on a cluster)."""
    return env.get("WANDB_MODE") or ("online" if env.get("WANDB_API_KEY") else "offline")


def wandb_run_id(out_dir: Path, resuming: bool) -> str:
    """The run id kept in `<out_dir>/wandb_run_id`, so a resumed run continues its wandb run. A fresh run in
    the same folder gets a new id: wandb ignores steps below a run's last one, so step 0 again would be lost."""
    path = out_dir / "wandb_run_id"
    if resuming and path.exists() and (run_id := path.read_text().strip()):
        return run_id
    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id + "\n")
    return run_id


class WandbTracker:
    def __init__(self, module: Any, out_dir: Path, start_step: int, project: str,
                 run_config: dict[str, Any] | None) -> None:
        run_id = wandb_run_id(out_dir, resuming=start_step > 0)
        # masked again here: a caller's run_config may hold SecretStr objects or a resolved key
        self.run = module.init(project=project, dir=str(out_dir), id=run_id, resume="allow",
                               config=masked(run_config), name=out_dir.resolve().name, mode=wandb_mode(os.environ))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)  # a run that never wrote its summary shows as failed


def make_trackers(loggers: Iterable[str], out_dir: Path, start_step: int, wandb_project: str,
                  run_config: dict[str, Any] | None) -> list[Tracker]:
    """The sinks named in `loggers` ("jsonl" is metrics.jsonl, always written by MetricsSink)."""
    names = list(dict.fromkeys(loggers))
    unknown = [n for n in names if n != "jsonl" and n not in PACKAGES]
    if unknown:
        raise ConfigError(f"train.loggers: unknown logger(s) {unknown}; choose from jsonl, tensorboard, wandb")
    # Every package is imported before any sink starts, so a missing one fails before a wandb run exists.
    modules = {n: _import(n) for n in names if n in PACKAGES}
    trackers: list[Tracker] = []
    try:
        if "tensorboard" in modules:
            trackers.append(TensorBoardTracker(modules["tensorboard"], out_dir, start_step))
        if "wandb" in modules:
            trackers.append(WandbTracker(modules["wandb"], out_dir, start_step, wandb_project, run_config))
    except BaseException:  # no MetricsSink will exist to close the ones already started
        for tracker in trackers:
            tracker.close(ok=False)
        raise
    return trackers
