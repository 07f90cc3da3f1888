"""Supervised fine-tuning: next-token cross-entropy on the trained tokens (assistant turns), summed over
tokens, so the loop's per-step division makes it the mean over the step's trained tokens.

Packing puts several samples into one row of at most `max_len` tokens (`common.pack`, attention kept
inside each sample), and a micro-batch is `micro_batch_size` such rows: a packed batch computes exactly
the per-token losses of the unpacked one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.config.stages import StageOptimConfig
from agentrl.learner.stage import LossOut, chunks
from agentrl.learner.stages.common import Rows, lay_out, pack, save_module
from agentrl.utils.padding import pad_right


class SFTKind:
    name = "sft"

    def __init__(self, pad_id: int, packing: bool = False, max_len: int = 2048, zero3: bool = False) -> None:
        self.pad_id, self.packing, self.max_len, self.zero3 = pad_id, packing, max_len, zero3

    def load_model(self, path: str, optim: StageOptimConfig) -> torch.nn.Module:
        from agentrl.learner.models import load_causal_lm

        return load_causal_lm(path, optim)

    def prepare(self, engine, samples: list, micro_batch_size: int) -> list:
        return samples

    def units(self, sample) -> float:
        return float(sum(sample.mask[1:]))  # the first token has nothing before it to predict it

    def micro_batches(self, samples: list, micro_batch_size: int) -> list[list]:
        """Unpacked: `micro_batch_size` samples each. Packed: rows of up to max_len tokens, then
        `micro_batch_size` rows each (a micro-batch is a list of rows, each a list of samples)."""
        if not self.packing:
            return [[[s] for s in chunk] for chunk in chunks(samples, micro_batch_size)]
        return chunks(pack(samples, self.max_len), micro_batch_size)

    def loss(self, engine, micro: list[list]) -> LossOut:
        rows, mask = packed_tensors(micro, self.pad_id, self.packing)
        device = engine.device
        logits = engine(**rows.inputs(device)).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), rows.ids[:, 1:].to(device),
                                                reduction="none")
        m = mask[:, 1:].to(device)
        loss_sum = (nll * m).sum()
        n = sum(len(row) for row in micro)
        return LossOut(loss_sum, float(m.sum()), {"tokens": float(m.sum())}, n)

    def save(self, module: torch.nn.Module, out_dir: Path, tokenizer) -> None:
        save_module(module, out_dir, tokenizer, self.zero3)


def packed_tensors(rows: list[list], pad_id: int, packed: bool) -> tuple[Rows, torch.Tensor]:
    """The rows of samples laid out (`common.lay_out`) and their (R, T) loss mask: a sample's first token
    has loss mask 0 (in a packed row the previous sample's last token must not predict it)."""
    laid = lay_out([[s.tokens for s in row] for row in rows], pad_id, packed)
    masks: list[list[int]] = [[] for _ in rows]
    for (r, _, _), s in zip(laid.spans, [s for row in rows for s in row]):
        masks[r] += [0] + list(s.mask[1:])
    return laid, pad_right(masks, 0.0, torch.float32, laid.ids.shape[1])
