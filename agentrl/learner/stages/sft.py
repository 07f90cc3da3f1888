"""Supervised fine-tuning: next-token cross-entropy on the trained tokens (assistant turns), summed over
tokens, so the loop's per-step division makes it the mean over the step's trained tokens.

Packing puts several samples into one row of at most `max_len` tokens. Each sample's position ids
restart at 0 and no attention mask is passed: transformers (masking_utils.find_packed_sequence_indices)
then builds a block-diagonal causal mask, so a token attends only to its own sample and a packed
batch computes exactly the per-token losses of the unpacked one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.config.stages import StageOptimConfig
from agentrl.learner.stage import LossOut, chunks
from agentrl.learner.stages.common import save_module
from agentrl.utils.padding import pad_right, pad_tokens


def pack(samples: list, max_len: int) -> list[list]:
    """Greedy first-fit in order: consecutive samples share a row while their total stays <= max_len."""
    rows: list[list] = []
    used = max_len + 1
    for s in samples:
        if used + len(s.tokens) > max_len:
            rows.append([])
            used = 0
        rows[-1].append(s)
        used += len(s.tokens)
    return rows


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
        ids, attn, pos, mask = packed_tensors(micro, self.pad_id)
        device = engine.device
        kwargs = {"position_ids": pos.to(device)} if self.packing else {"attention_mask": attn.to(device)}
        logits = engine(input_ids=ids.to(device), use_cache=False, **kwargs).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:].to(device),
                                                reduction="none")
        m = mask[:, 1:].to(device)
        loss_sum = (nll * m).sum()
        n = sum(len(row) for row in micro)
        return LossOut(loss_sum, float(m.sum()), {"tokens": float(m.sum())}, n)

    def save(self, module: torch.nn.Module, out_dir: Path, tokenizer) -> None:
        save_module(module, out_dir, tokenizer, self.zero3)


def packed_tensors(rows: list[list], pad_id: int) -> tuple[torch.Tensor, ...]:
    """(ids, attention_mask, position_ids, loss_mask) of rows of samples: a row's samples are
    concatenated with position ids restarting at each; a row's first token of each sample has loss
    mask 0 (the previous sample's last token must not predict it)."""
    tokens = [[t for s in row for t in s.tokens] for row in rows]
    ids, attn = pad_tokens(tokens, pad_id)
    T = ids.shape[1]
    pos = torch.zeros_like(ids)
    masks = []
    for i, row in enumerate(rows):
        p, m = [], []
        for s in row:
            p += list(range(len(s.tokens)))
            m += [0] + list(s.mask[1:])
        # padding continues the positions of one more "sample", so it never joins the last real one
        p += list(range(T - len(p)))
        pos[i] = torch.tensor(p, dtype=torch.long)
        masks.append(m)
    return ids, attn, pos, pad_right(masks, 0.0, torch.float32, T)
