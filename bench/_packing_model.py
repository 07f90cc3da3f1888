"""On paper: one learner step on ragged episodes, padded vs token-budget vs packed (issue 52), for
`python bench/scale_model.py --packing`. Pure arithmetic, standard library only.

FLOPs of a sequence of n computed tokens through a dense decoder of P parameters, L layers, width d,
forward + backward (3x the forward):
    linear:    6 * P * n                        (every weight multiply-add, twice per token forward)
    attention: 6 * L * d * n^2                  (causal QK^T and AV: 2 * 2 * d * n^2 / 2 per layer forward)
Padded (agentrl's row-count path): every row is computed at the batch's longest length, and the padded
keys still enter every query's attention (a mask hides them, the kernels still compute them), so a row
costs the full n_max both ways. Token-budget micro-batches: rows sorted by length and cut into micro-batches
of about `budget` tokens, each padded to its own longest row. Packed (flash-attention varlen): exactly the
real tokens, attention only within each sequence. The step time is FLOPs / (GPUs * peak * MFU) with the
same MFU on every side: packing's varlen kernels are the ones used for long sequences anyway, so this is
the compute saved, not a kernel comparison. Episode lengths are drawn from a log-normal with the given
mean and standard deviation (seeded), clipped to [min_len, max_len].
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class PackingCase:
    params: float = 7.6e9  # Qwen2.5-7B: 28 layers, width 3,584
    layers: int = 28
    width: int = 3584
    gpus: int = 8
    peak_flops: float = 989e12  # H100 SXM dense bf16
    mfu: float = 0.4
    episodes: int = 256  # per learner step: 32 prompts x 8 samples
    mean_len: float = 8192
    std_len: float = 6144
    min_len: int = 256
    max_len: int = 32768
    budget: int = 32768  # tokens per micro-batch on the token-budget side
    seed: int = 0


def lengths(c: PackingCase) -> list[int]:
    """Episode lengths: log-normal with mean `mean_len` and std `std_len` (moment-matched), clipped."""
    sigma2 = math.log(1 + (c.std_len / c.mean_len) ** 2)
    mu = math.log(c.mean_len) - sigma2 / 2
    rng = random.Random(c.seed)
    return [int(min(max(rng.lognormvariate(mu, math.sqrt(sigma2)), c.min_len), c.max_len)) for _ in range(c.episodes)]


def seq_flops(c: PackingCase, n: int) -> float:
    """Forward + backward FLOPs of one row of n computed tokens (see the module docstring)."""
    return 6 * c.params * n + 6 * c.layers * c.width * n * n


def budget_micro_batches(lens: list[int], budget: int) -> list[list[int]]:
    """Rows sorted longest first, cut into contiguous runs that padded to their first (longest) row hold
    <= budget tokens (a longer row alone): `learner.micro_batch_tokens`'s plan (learner/packing.py)."""
    out: list[list[int]] = []
    for n in sorted(lens, reverse=True):
        if out and out[-1][0] * (len(out[-1]) + 1) <= budget:
            out[-1].append(n)
        else:
            out.append([n])
    return out


def step_flops(c: PackingCase, lens: list[int]) -> dict[str, tuple[float, float]]:
    """Per side: (FLOPs of the step, tokens computed / real tokens)."""
    real, longest = sum(lens), max(lens)
    micro = budget_micro_batches(lens, c.budget)
    budget_tokens = sum(len(m) * max(m) for m in micro)
    return {
        "padded": (len(lens) * seq_flops(c, longest), len(lens) * longest / real),
        "token budget": (sum(len(m) * seq_flops(c, max(m)) for m in micro), budget_tokens / real),
        "packed": (sum(seq_flops(c, n) for n in lens), 1.0),
    }


def print_packing(c: PackingCase) -> None:
    lens = lengths(c)
    rate = c.gpus * c.peak_flops * c.mfu
    print(f"Learner step, {c.params / 1e9:g}B ({c.layers} layers, width {c.width}) on {c.gpus} GPUs at "
          f"{c.peak_flops / 1e12:g} TFLOP/s x MFU {c.mfu:g}; {c.episodes} episodes of {c.mean_len:g} +- "
          f"{c.std_len:g} tokens (log-normal, clipped to {c.min_len}-{c.max_len}; drawn: mean "
          f"{sum(lens) / len(lens):.0f}, longest {max(lens)}), token budget {c.budget}\n")
    sides = step_flops(c, lens)
    packed_s = sides["packed"][0] / rate
    print("| side | tokens computed / real | step s | vs packed |")
    print("|---|---:|---:|---:|")
    for name, (flops, pad) in sides.items():
        print(f"| {name} | {pad:.2f} | {flops / rate:.1f} | {flops / rate / packed_s:.2f}x |")
