"""Supervised warm start on demonstrations, tokenised exactly as the rollout ledger tokenises them."""

from __future__ import annotations

import importlib
import logging
import os
import random
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from agentrl.chat import ChatFormat, Message
from agentrl.config import DefaultModelConfig

log = logging.getLogger(__name__)


def ledger_from_messages(fmt: ChatFormat, messages: list[Message]) -> tuple[list[int], list[int]]:
    """(tokens, loss_mask) for a finished conversation: assistant turns are trained (mask 1),
    everything else is context (mask 0). Mirrors rollout.run_episode's ledger."""
    first_asst = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    tokens = fmt.initial(messages[:first_asst])
    mask = [0] * len(tokens)
    i = first_asst
    while i < len(messages):
        turn = fmt.assistant_tokens(messages[i]["content"])
        tokens += turn
        mask += [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if i + 1 < j:
            suffix = fmt.continuation(messages[i + 1:j])
            tokens += suffix
            mask += [0] * len(suffix)
        i = j
    return tokens, mask


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


TaskMaker = Callable[[int, int, str], list[dict[str, Any]]]  # (n, seed, split) -> tasks
Demonstration = Callable[[dict[str, Any], random.Random, float], list[Message]]  # (task, rng, optimal_prob)


def demo_source(task: str) -> tuple[TaskMaker, Demonstration]:
    """The warm-start task's generator and teacher: `envs.<task>.demo_tasks` and `.demonstration`."""
    module = importlib.import_module(f"envs.{task}")
    return module.demo_tasks, module.demonstration


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota if one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cores


def warm_start(model: Any, tokenizer: Any, cfg: DefaultModelConfig) -> float:
    """Train `model` in place on imperfect demonstrations of `cfg.task`; returns the final loss.

    Torch threads are capped at the usable cores meanwhile: more OpenMP threads than cores spin
    against each other and slowed this step 25x under contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, usable_cores())))
    try:
        return _train(model, tokenizer, cfg)
    finally:
        torch.set_num_threads(threads)


def _train(model: Any, tokenizer: Any, cfg: DefaultModelConfig) -> float:
    if cfg.sft_steps == 0:  # an untrained model (OneCycleLR rejects zero steps)
        return float("nan")
    make_tasks, demonstration = demo_source(cfg.task)
    rng = random.Random(cfg.seed)
    fmt = ChatFormat(tokenizer)
    tasks = make_tasks(cfg.sft_demos, cfg.seed, "demo")
    examples = [ledger_from_messages(fmt, demonstration(t, rng, cfg.demo_optimal_prob)) for t in tasks]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.sft_lr, total_steps=cfg.sft_steps, pct_start=0.1)
    model.train()
    loss_val = float("nan")
    bar = tqdm(range(cfg.sft_steps), desc="warm start (SFT)", dynamic_ncols=True)
    for _, (ids, attn, labels) in zip(bar, _batches(examples, cfg.sft_batch_size, tokenizer.pad_token_id, rng)):
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
