"""The logit head on the scored tail of a batch only.

An RL row is a prompt followed by the policy's turns: the loss reads log pi at the generated tokens
alone, and those need the logits at one position before each. A causal LM's hidden states must run
over every position, but its (B, T, V) head need not: from one position before the batch's earliest
scored token to the end is enough. On SmolLM2 (V = 49k, hidden 576) the head is a fifth of a token's
FLOPs, and a 3-shot reasoning-gym prompt is 127 of about 180 positions; at V = 152k on a GPU, the
prompt's logits are most of a step's activation memory. Hugging Face causal LMs take the count of
trailing positions to keep as `logits_to_keep`; a model whose forward lacks it gets every position.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Piece:
    """Logits for some rows of a micro-batch, from position `start` on."""

    rows: torch.Tensor  # (n,) row indices in the micro-batch
    logits: torch.Tensor  # (n, T - start, V)
    ids: torch.Tensor  # (n, T - start)
    scored: torch.Tensor  # (n, T - start)
    start: int


@functools.cache
def _forward_params(model_type: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_type.forward).parameters)


def forward_params(module: torch.nn.Module) -> tuple[frozenset[str], torch.nn.Module]:
    """(names the forward of the causal LM under a DeepSpeed engine (`.module`) and a PEFT wrapper
    takes, that model)."""
    model = getattr(module, "module", module)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return _forward_params(type(model)), model


def accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    return "logits_to_keep" in forward_params(module)[0]


def tail_start(scored_BT: torch.Tensor) -> int:
    """First position whose logits some scored token needs: one before the earliest column with a
    scored token (token t is predicted by the logits at t - 1); 0 when nothing is scored."""
    columns = scored_BT.gt(0).any(dim=0).nonzero()
    return max(int(columns[0]) - 1, 0) if len(columns) else 0


def tail_forward(model, ids_BT: torch.Tensor, attention_BT: torch.Tensor, scored_BT: torch.Tensor,
                 rows: torch.Tensor) -> Piece:
    """The rows' logits (B, T - start, V) from the tail's start on, with their ids and scored mask there;
    start is 0 (every position) for a model without `logits_to_keep`."""
    start = tail_start(scored_BT) if accepts_logits_to_keep(model) else 0
    keep = {"logits_to_keep": ids_BT.shape[1] - start} if start else {}
    logits = model(input_ids=ids_BT, attention_mask=attention_BT, **keep).logits
    return Piece(rows, logits, ids_BT[:, start:], scored_BT[:, start:], start)


def pad_left(values_BS: torch.Tensor, start: int) -> torch.Tensor:
    """(B, start + S): `start` zero columns before the tail's values, aligned with the ids again."""
    return F.pad(values_BS, (start, 0)) if start else values_BS
