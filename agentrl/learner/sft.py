"""Supervised fine-tuning on token ledgers: (tokens, loss mask) pairs built exactly as rollout builds
them (`agentrl.chat.ledger_from_messages`), so the warm-started model sees the tokens it will generate.

A plain torch loop (AdamW, one-cycle schedule) for the embedded default's warm start; the stages of
issue 11 (SFT / RM / PRM / DPO / KTO on DeepSpeed) will share one loop with it.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import torch
from tqdm import tqdm

from agentrl.learner.dist import usable_cores

log = logging.getLogger(__name__)

Example = tuple[list[int], list[int]]  # (tokens, loss_mask): mask 1 on trained (assistant) tokens


@dataclass(frozen=True)
class SFTSettings:
    steps: int  # optimizer steps; 0 leaves the model untrained
    batch_size: int  # examples per step, sampled without replacement within a step
    lr: float  # peak learning rate of the one-cycle schedule


def _batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rng: random.Random):
    while True:
        chosen = rng.sample(examples, batch_size)
        T = max(len(t) for t, _ in chosen)
        ids = torch.full((batch_size, T), pad_id, dtype=torch.long)
        labels = torch.full((batch_size, T), -100, dtype=torch.long)
        attn = torch.zeros((batch_size, T), dtype=torch.long)
        for b, (toks, mask) in enumerate(chosen):
            n = len(toks)
            ids[b, :n] = torch.tensor(toks)
            attn[b, :n] = 1
            labels[b, :n] = torch.where(torch.tensor(mask) == 1, torch.tensor(toks), torch.tensor(-100))
        yield ids, attn, labels


def warm_start(model, examples: list[Example], pad_id: int, cfg: SFTSettings, rng: random.Random) -> float:
    """Train `model` in place on `examples`, batches drawn with `rng`; returns the final loss (NaN when
    cfg.steps is 0). `rng` is the caller's, so a warm start is reproducible from one seed.

    Torch threads are capped at the usable cores meanwhile: more OpenMP threads than cores spin
    against each other and slowed this step 25x under contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, usable_cores())))
    try:
        return _train(model, examples, pad_id, cfg, rng)
    finally:
        torch.set_num_threads(threads)


def _train(model, examples: list[Example], pad_id: int, cfg: SFTSettings, rng: random.Random) -> float:
    if cfg.steps == 0:  # an untrained model (OneCycleLR rejects zero steps)
        return float("nan")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    model.train()
    loss_val = float("nan")
    bar = tqdm(range(cfg.steps), desc="warm start (SFT)", dynamic_ncols=True)
    for _, (ids, attn, labels) in zip(bar, _batches(examples, cfg.batch_size, pad_id, rng)):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        bar.set_postfix(loss=f"{loss_val:.3f}")
    model.eval()
    log.info("warm start finished: loss %.4f", loss_val)
    return loss_val
