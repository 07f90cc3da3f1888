"""The learner checkpoint's files: what a resumed run needs to take the same next step.

    <folder>/actor/, <folder>/critic/   DeepSpeed checkpoints: weights, the AdamW moments and step
                                        counts, the lr scheduler, per-rank ZeRO shards
    <folder>/learner_state.pt           `Learner.state_dict()` (version, batches seen, the EMA shadow,
                                        the KL controller, the reward normaliser, the unsupervised-text
                                        cursor) and the torch RNG, written by rank 0 (the same on every rank)

These functions know engines, folders and a state dict, not the Learner: the Learner owns its state
(`state_dict` / `load_state_dict`) and composes them. Every rank calls them: DeepSpeed's save and
load are collective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

STATE_FILE = "learner_state.pt"


def save_engines(engines: dict[str, Any], folder: str | Path) -> None:
    """Each DeepSpeed engine (None = not built) under its tag, with its optimizer and scheduler."""
    for tag, engine in engines.items():
        if engine is not None:
            engine.save_checkpoint(str(folder), tag=tag, save_latest=False)


def load_engines(engines: dict[str, Any], folder: str | Path) -> None:
    folder = Path(folder)
    for tag, engine in engines.items():
        if engine is None:
            continue
        if not (folder / tag).is_dir():
            raise FileNotFoundError(f"{folder}: no {tag}/ checkpoint (was it written with another algo.advantage?)")
        path, _ = engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                         load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"{folder / tag}: DeepSpeed found no checkpoint to load")


def save_state(state: dict[str, Any], folder: str | Path) -> None:
    """`state` with the torch RNG as it is now (the RNG goes back last, in `restore_rng`)."""
    torch.save({**state, "rng": torch.get_rng_state()}, Path(folder) / STATE_FILE)


def load_state(folder: str | Path) -> dict[str, Any]:
    return torch.load(Path(folder) / STATE_FILE, weights_only=False)


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["rng"])


def optimizer_digest(engine) -> dict[str, float]:
    """Sums of the actor's Adam moments, its step count and learning rate: equal before a save and
    after a load exactly when the optimizer came back (sums over this rank's partitions under ZeRO)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # ZeRO wraps the torch optimizer
    exp_avg = exp_avg_sq = 0.0
    steps = 0.0
    for st in inner.state.values():
        if "exp_avg" in st:
            exp_avg += float(st["exp_avg"].double().sum())
            exp_avg_sq += float(st["exp_avg_sq"].double().sum())
            steps = max(steps, float(st["step"]))
    return {"exp_avg_sum": exp_avg, "exp_avg_sq_sum": exp_avg_sq, "adam_step": steps, "lr": engine.get_lr()[0]}
