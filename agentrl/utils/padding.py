"""Right padding, the one way the project turns ragged rows into (B, T) tensors: RL batches,
stage micro-batches, reward-model inputs and unsupervised text all pad at the end, so position t of a
row is its t-th token and a row's last real token is at its length - 1."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def pad_right(rows: Sequence[Sequence[Any]], fill: float | int, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    """(len(rows), width) tensor of `dtype`: each row's values, then `fill`; width defaults to the longest row."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, :len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def pad_tokens(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T) long, right-padded with `pad_id`."""
    ids = pad_right(rows, pad_id, torch.long)
    return ids, pad_right([[1] * len(r) for r in rows], 0, torch.long, ids.shape[1])
