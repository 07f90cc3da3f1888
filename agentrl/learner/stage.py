"""One DeepSpeed loop for every stage before RL: SFT, reward model, PRM, DPO and KTO.

A stage kind (`agentrl.learner.stages`) says how to load its model, batch its samples and compute a
loss; this loop owns everything else, the same for all of them and for the RL learner's engines:
the DeepSpeed engine (`models.trained_engine`: ZeRO 0-3, offload, bf16, LoRA, gradient checkpointing,
the warmup + decay schedule of `models.lr_factor`), global and micro batch sizes over the ranks,
epochs, periodic evaluation on the held-out samples, the progress bar, the metric sinks and the
saved Hugging Face folder.

The loss of one optimizer step is the exact mean over the step's loss units (tokens for SFT, pairs
or examples otherwise): each micro-batch's loss is its unit-sum divided by the step's unit count (and
multiplied by the rank count DeepSpeed averages over). So the gradient does not depend on how samples
are split into micro-batches or packed into rows.

Ranks: one process by default; under `torchrun`/`deepspeed` (RANK and WORLD_SIZE set) each rank takes
its share of every step's samples, and rank 0 writes the outputs.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from agentrl.config.stages import StageConfig, StageOptimConfig
from agentrl.learner.step_parts import accumulate

log = logging.getLogger(__name__)


@dataclass
class LossOut:
    """A micro-batch's summed loss (with gradients), its loss units, and metric sums over its examples."""

    loss_sum: torch.Tensor
    units: float
    sums: dict[str, float] = field(default_factory=dict)  # metric name -> sum over `count` examples
    count: int = 0


class StageKind(Protocol):
    name: str

    def load_model(self, path: str, optim: StageOptimConfig) -> torch.nn.Module:
        """The trainable module (gradient checkpointing and LoRA applied as configured)."""

    def prepare(self, engine, samples: list, micro_batch_size: int) -> list:
        """Samples as the loss needs them (DPO/KTO: with the starting model's reference log-probs)."""

    def units(self, sample) -> float:
        """Loss units of one sample (its trained tokens for SFT, 1 per example otherwise)."""

    def micro_batches(self, samples: list, micro_batch_size: int) -> list[list]:
        """Group a rank's samples of one step into micro-batches (SFT packs them into rows)."""

    def loss(self, engine, micro: list) -> LossOut:
        """Summed loss and metrics of one micro-batch."""

    def save(self, module: torch.nn.Module, out_dir: Path, tokenizer) -> None:
        """Write `module` (gathered, on rank 0) as a Hugging Face folder."""


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def total_steps(n_train: int, optim: StageOptimConfig) -> int:
    """Optimizer steps: `epochs` passes of whole global batches (the last partial batch is kept), capped
    by `max_steps`."""
    per_epoch = max(1, math.ceil(n_train / optim.batch_size))
    steps = per_epoch * optim.epochs
    return steps if optim.max_steps is None else min(steps, optim.max_steps)


def step_batches(n_train: int, optim: StageOptimConfig, seed: int):
    """Indices of each step's samples: a fresh seeded shuffle per epoch, global batches in order."""
    rng = random.Random(seed)
    steps = total_steps(n_train, optim)
    done = 0
    while done < steps:
        order = rng.sample(range(n_train), n_train)
        for batch in chunks(order, optim.batch_size):
            if done == steps:
                return
            yield batch
            done += 1


def _dist() -> tuple[int, int]:
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _check_batches(optim: StageOptimConfig, world: int) -> int:
    """Micro-batches per rank and step (DeepSpeed's accumulation steps; packing may need fewer)."""
    per_step = optim.micro_batch_size * world
    if optim.batch_size % per_step:
        raise ValueError(f"optim.batch_size={optim.batch_size} must be a multiple of optim.micro_batch_size * "
                         f"ranks = {optim.micro_batch_size} * {world}")
    return optim.batch_size // per_step


def _forward_all(kind: StageKind, engine, micros: list[list]):
    """(loss sum, metric sums, example count) over micro-batches, without gradients."""
    loss_total, sums, count = 0.0, {}, 0
    for micro in micros:
        out = kind.loss(engine, micro)
        loss_total += float(out.loss_sum.detach())
        for key, value in out.sums.items():
            sums[key] = sums.get(key, 0.0) + value
        count += out.count
    return loss_total, sums, count


def _all_reduce(values: list[float], op: str = "sum") -> list[float]:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()


def _reduce(loss: float, units: float, sums: dict[str, float], count: int, prefix: str) -> dict[str, float]:
    keys = sorted(sums)
    loss, units, count, *vals = _all_reduce([loss, units, float(count), *(sums[k] for k in keys)])
    out = {f"{prefix}loss": loss / max(units, 1e-12)}
    out.update({f"{prefix}{k}": v / max(count, 1.0) for k, v in zip(keys, vals)})
    return out


@torch.no_grad()
def evaluate(kind: StageKind, engine, samples: list, micro_batch_size: int) -> dict[str, float]:
    """Mean loss per unit and mean metrics over this rank's share of `samples`, reduced over ranks.
    Ranks run the same number of forward passes (ZeRO-3 gathers are collective): one with fewer
    micro-batches repeats its first and discards the result."""
    rank, world = _dist()
    mine = samples[rank::world]
    micros = kind.micro_batches(mine, micro_batch_size)
    passes = int(_all_reduce([float(len(micros))], "max")[0])
    engine.eval()
    loss, sums, count = _forward_all(kind, engine, micros)
    for _ in range(passes - len(micros)):
        kind.loss(engine, micros[0] if micros else kind.micro_batches(samples[:1], 1)[0])
    engine.train()
    return _reduce(loss, sum(kind.units(s) for s in mine), sums, count, "eval/")


def _train_step(kind: StageKind, engine, batch: list, rank: int, world: int, micro_batch_size: int) -> dict[str, Any]:
    """One optimizer step of a stage on `batch` (this rank's share of it); the step's record."""
    units = sum(kind.units(s) for s in batch)
    mine = batch[rank::world]
    # The step's gradient is d(sum of unit losses) / units however the samples are split: DeepSpeed
    # averages over ranks, so the rank count is multiplied back (the RL learner does the same).
    scale = world / max(units, 1e-12)
    micros = [(m, scale) for m in kind.micro_batches(mine, micro_batch_size)]
    # Every rank runs the same number of passes (ZeRO-3 gathers weights in each forward, a
    # collective): a rank with fewer micro-batches (packing, a short last batch) repeats one at weight 0.
    passes = int(_all_reduce([float(len(micros))], "max")[0])
    micros += [(kind.micro_batches(batch[:1], 1)[0], 0.0)] * (passes - len(micros))
    loss, sums, count = 0.0, {}, 0
    lr = engine.get_lr()[0]  # the rate this step applies (the schedule advances in step())

    def micro_loss(i: int) -> torch.Tensor:
        nonlocal loss, count
        micro, weight = micros[i]
        out = kind.loss(engine, micro)
        if weight:
            loss, count = loss + float(out.loss_sum.detach()), count + out.count
            for key, value in out.sums.items():
                sums[key] = sums.get(key, 0.0) + value
        return out.loss_sum * weight

    accumulate(engine, len(micros), micro_loss)
    return {"lr": lr, "samples": len(batch), "units": units,
            **{f"train/{k}": v for k, v in _reduce(loss, units, sums, count, "").items()}}


def run_stage(kind: StageKind, cfg: StageConfig, model_path: str, train: list, held_out: list, tokenizer,
              data_stats: dict[str, Any] | None = None, show: bool = True) -> dict[str, Any]:
    """Train `kind` from `model_path` on `train`, evaluating on `held_out`; writes metrics.jsonl,
    summary.json and (when `cfg.train.save_model`) the model to `cfg.train.out_dir`. Returns the summary."""
    from agentrl.learner.dist import init_single_process_dist
    from agentrl.learner.models import trained_engine
    from agentrl.telemetry.metrics import MetricsSink

    if not train:
        raise ValueError(f"{kind.name}: no training samples left (check data.paths, data.max_len and the dropped counts)")
    init_single_process_dist()
    rank, world = _dist()
    optim = cfg.optim
    grad_accum = _check_batches(optim, world)
    steps = total_steps(len(train), optim)
    torch.manual_seed(cfg.train.seed)
    module = kind.load_model(model_path, optim)
    engine = trained_engine(module, optim, optim.micro_batch_size, grad_accum, optim.dtype == "bfloat16", steps)
    started = time.perf_counter()
    train = kind.prepare(engine, train, optim.micro_batch_size)
    held_out = kind.prepare(engine, held_out, optim.micro_batch_size) if held_out else []
    out_dir = Path(cfg.train.out_dir)
    sink = MetricsSink(out_dir, steps, show=show, loggers=cfg.train.loggers, wandb_project=cfg.train.wandb_project,
                       run_config=cfg.model_dump(), desc=kind.name,
                       postfix=lambda r: {"loss": f"{r['train/loss']:.4f}"}) if rank == 0 else None
    evals: list[dict[str, float]] = []
    if held_out:
        evals.append({"step": 0, **evaluate(kind, engine, held_out, optim.micro_batch_size)})
    record: dict[str, Any] = {}
    for step, indices in enumerate(step_batches(len(train), optim, cfg.train.seed)):
        t0 = time.perf_counter()
        record = {"step": step, **_train_step(kind, engine, [train[i] for i in indices], rank, world,
                                              optim.micro_batch_size),
                  "step_s": time.perf_counter() - t0, "elapsed_s": time.perf_counter() - started}
        if cfg.train.eval_every and held_out and (step + 1) % cfg.train.eval_every == 0 and step + 1 < steps:
            record.update(evaluate(kind, engine, held_out, optim.micro_batch_size))
            evals.append({"step": step + 1, **{k: v for k, v in record.items() if k.startswith("eval/")}})
        if sink is not None:
            sink.log(record)
    if held_out:
        evals.append({"step": steps, **evaluate(kind, engine, held_out, optim.micro_batch_size)})
    if cfg.train.save_model:
        out_dir.mkdir(parents=True, exist_ok=True)
        kind.save(engine.module, out_dir, tokenizer)
    summary = {"stage": kind.name, "model": model_path, "steps": steps, "train_samples": len(train),
               "eval_samples": len(held_out), "data": data_stats or {}, "final_train": record,
               "evals": evals, "seconds": time.perf_counter() - started,
               "saved": str(out_dir) if cfg.train.save_model else None}
    if sink is not None:
        sink.write_summary(summary)
        sink.close()
        log.info("%s: %d steps in %.1f s; %s", kind.name, steps, summary["seconds"],
                 json.dumps(evals[-1] if evals else record))
    return summary
