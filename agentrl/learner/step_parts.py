"""Small pieces of a learner step: gradient accumulation (the one routine the RL learner and the
stages share), the local gradient norm, an empty micro-step's loss, the mask of a rank's rows, and how
per-micro-batch (or per-rank) metrics combine; the KL weight's controller."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from agentrl.algo import KLController, make_kl_controller, step_kl
from agentrl.config import AlgoConfig
from agentrl.learner.models import trainable_params
from agentrl.types import TrainBatch


def accumulate(engine, n_micro: int, micro_loss: Callable[[int], torch.Tensor],
               after_backward: Callable[[int], None] | None = None) -> None:
    """One optimizer step of a DeepSpeed engine over `n_micro` micro-batches, `micro_loss(i)` each
    (the forward runs after the previous backward, so one micro-batch's graph is alive at a time).

    Each loss comes already weighted by its micro-batch's share of the step's loss units over all
    ranks, times the rank count (DeepSpeed averages gradients over ranks), so ragged micro-batches
    and ranks sum exactly: DeepSpeed's own division by its accumulation count is off. The boundary is
    set by hand on the last micro-batch because the count can change from step to step (packing,
    a short last batch)."""
    for i in range(n_micro):
        engine.set_gradient_accumulation_boundary(i == n_micro - 1)
        engine.backward(micro_loss(i), scale_wrt_gas=False)
        if after_backward is not None:
            after_backward(i)
    engine.step()


def micro_slices(rows: range, n: int) -> list[slice]:
    """Exactly `n` contiguous slices of `rows`, as equal as ceil division makes them (every rank runs
    the same number of micro-steps); trailing ones may be empty."""
    size = math.ceil(len(rows) / n) if len(rows) else 0
    return [slice(min(rows.start + k * size, rows.stop), min(rows.start + (k + 1) * size, rows.stop)) for k in range(n)]


def local_grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad.detach().float() for p in module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0


def rows_mask(size: int, rows: range) -> torch.Tensor:
    """(size, 1) float: 1 on `rows`."""
    out = torch.zeros(size, 1)
    out[rows.start:rows.stop] = 1.0
    return out


def widen(values_NW: torch.Tensor, width: int) -> torch.Tensor:
    """(N, width): a micro-batch's per-position values, run only up to its longest row, with zero columns after."""
    return F.pad(values_NW, (0, width - values_NW.shape[1])) if values_NW.shape[1] < width else values_NW


def zero_loss(module: torch.nn.Module) -> torch.Tensor:
    """A loss of exactly 0 that still touches every trainable parameter, for an empty micro-step."""
    return sum(p.sum() * 0.0 for p in trainable_params(module))


def weighted(rows: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Combine per-micro-batch metrics, weighted by their token (or row) counts; max/min stay max/min."""
    if not rows:
        return {}
    total = sum(n for n, _ in rows) or 1.0
    out: dict[str, float] = {}
    for key in rows[0][1]:
        vals = [m[key] for _, m in rows if key in m]
        if key.endswith("_max"):
            out[key] = max(vals)
        elif key.endswith("_min"):
            out[key] = min(vals)
        else:
            out[key] = sum(n * m.get(key, 0.0) for n, m in rows) / total
    return out


def kl_controller(algo: AlgoConfig) -> KLController:
    """The KL weight's controller (algo.kl.controller); without a KL term a fixed weight 0, kept so the
    checkpoint's state has the same shape."""
    if not algo.has_kl:
        return make_kl_controller("fixed", 0.0)
    ctl = algo.kl.controller
    if ctl.type == "adaptive":
        return make_kl_controller("adaptive", algo.kl.coef, ctl.target, ctl.horizon)
    return make_kl_controller(ctl.type, algo.kl.coef)


def kl_gate(logprobs: Callable[[TrainBatch, range], torch.Tensor], batch: TrainBatch, rows: range,
            old_logp: torch.Tensor, target_kl: float) -> tuple[dict[str, float], torch.Tensor | None]:
    """learner.target_kl: how far the batch's earlier steps moved the actor on `rows` (`step_kl` from pi_prox, by
    a no-grad pass `logprobs`) and whether it stops there: ({"step_kl", "kl_stopped"}, log pi). The log pi, only
    when stopped and the batch records per-token values, is the current one on `rows` and every later row: the
    viewer's `learner_logprobs` for the rows the actor skips."""
    sl, logp = slice(rows.start, rows.stop), logprobs(batch, rows)
    kl = step_kl(old_logp[sl], logp[sl], batch.loss_mask[sl])
    if kl <= target_kl or not batch.record_values:
        return {"step_kl": kl, "kl_stopped": float(kl > target_kl)}, None
    if rows.stop < batch.size:  # later mini-batches: skipped too
        logp[rows.stop:] = logprobs(batch, range(rows.stop, batch.size))[rows.stop:]
    return {"step_kl": kl, "kl_stopped": 1.0}, logp
