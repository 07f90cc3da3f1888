"""The learner's part of a checkpoint: what a resumed run needs to take the same next step.

    <folder>/actor/, <folder>/critic/   DeepSpeed checkpoints (`save_checkpoint`): weights, the AdamW
                                        moments and step counts, the lr scheduler, per-rank ZeRO shards
    <folder>/learner_state.pt           version, batches seen (freeze_actor_steps), the EMA shadow, the
                                        KL controller, the reward normaliser, the unsupervised-text
                                        cursor, the torch RNG (written by rank 0; the same on every rank)

Every rank calls both functions: DeepSpeed's save and load are collective.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agentrl.learner.rl import Learner

STATE_FILE = "learner_state.pt"


def save_learner(learner: "Learner", folder: str | Path) -> None:
    folder = Path(folder)
    learner.engine.save_checkpoint(str(folder), tag="actor", save_latest=False)
    if learner.critic is not None:
        learner.critic.save_checkpoint(str(folder), tag="critic", save_latest=False)
    if learner.rank != 0:
        return
    state = {
        "version": learner.version, "batches_seen": learner.batches_seen, "unsup_drawn": learner.unsup_drawn,
        "kl_ctl": learner.kl_ctl.state_dict(), "reward_moments": learner.reward_moments.state_dict(),
        "ema": None if learner.ema is None else {"shadow": learner.ema.state_dict(),
                                                 "num_updates": learner.ema.num_updates},
        "rng": torch.get_rng_state(),
    }
    torch.save(state, folder / STATE_FILE)


def load_learner(learner: "Learner", folder: str | Path) -> dict[str, float]:
    """Restore `learner` (built as for a fresh run) from `folder`; returns `optimizer_digest`."""
    folder = Path(folder)
    for tag, engine in (("actor", learner.engine), ("critic", learner.critic)):
        if engine is None:
            continue
        if not (folder / tag).is_dir():
            raise FileNotFoundError(f"{folder}: no {tag}/ checkpoint (was it written with another algo.advantage?)")
        path, _ = engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                         load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"{folder / tag}: DeepSpeed found no checkpoint to load")
    state = torch.load(folder / STATE_FILE, weights_only=False)
    learner.version, learner.batches_seen = state["version"], state["batches_seen"]
    learner.kl_ctl.load_state_dict(state["kl_ctl"])
    learner.reward_moments.load_state_dict(state["reward_moments"])
    if (state["ema"] is None) != (learner.ema is None):
        raise ValueError(f"{folder}: the checkpoint {'has no' if state['ema'] is None else 'has an'} EMA, "
                         f"the config asks for {'one' if learner.ema is not None else 'none'} (learner.ema_decay)")
    if learner.ema is not None:
        learner.ema.load_state_dict(state["ema"]["shadow"])
        learner.ema.num_updates = state["ema"]["num_updates"]
    for _ in range(state["unsup_drawn"]):  # the text stream is deterministic from its seed
        next(learner.unsup_batches)
    learner.unsup_drawn = state["unsup_drawn"]
    torch.set_rng_state(state["rng"])
    return optimizer_digest(learner.engine)


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
