"""A group's common prompt through the model once: the learner's forward passes over a micro-batch.

GRPO samples n episodes of one task; their rows start with the same prompt (the system message,
few-shot turns, the question) and differ from the first generated token on. Run as separate rows,
the prompt's hidden states are computed n times, forward and backward, and on a few-shot task the
prompt is most of each row (reasoning-gym's 3-shot prompt: 127 of about 180 tokens). Here a group's
prefix runs once (batch 1, its key/value cache kept with its graph), the cache is repeated n times
and the n suffixes run on it, so gradients from every suffix flow back into the one prefix pass.
The logits are those of the separate rows up to float32 summation order (tests/test_shared_prefix.py).

The shared prefix ends before the logits the first scored token needs (`logit_tail.tail_start`),
so every logit the loss reads comes from the suffix pass. Rows without a group to share with, a group
whose sharing saves under `min_saved` multiply-adds (`MIN_SAVED`; the learner's `share_min_saved`), a
model whose forward takes no cache, and a model training under gradient checkpointing (Hugging Face
turns the cache off there) take the ordinary pass.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from agentrl.learner.logit_tail import Piece, accepts_logits_to_keep, forward_params, pad_left, tail_forward, tail_start

# Multiply-adds a group's sharing must save ((n - 1) x prefix positions x parameters): below it the extra
# passes cost about what they save (the embedded default, 1M parameters, stepped no faster sharing 8 groups'
# 30-token prompts: 0.99 s vs 1.03 s, bench/shared_prefix.py); SmolLM2 saves 28e9 a group on the quiz's
# 30-token prompt.
MIN_SAVED = 2e9

_PARAMETERS: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()


def common_prefix(ids_NT: torch.Tensor, attention_NT: torch.Tensor) -> int:
    """Length of the token prefix every row shares, all of it attended."""
    differs = ((ids_NT != ids_NT[:1]) | (attention_NT == 0)).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else ids_NT.shape[1]


def share_plan(ids_BT: torch.Tensor, attention_BT: torch.Tensor, scored_BT: torch.Tensor, groups_B: torch.Tensor,
               params: int, min_saved: float = MIN_SAVED) -> tuple[list[tuple[torch.Tensor, int]], torch.Tensor]:
    """([(rows of a group, prefix length they share)], the other rows). The prefix stops at the group's
    `tail_start`, so the suffix pass yields every logit a scored token needs."""
    shared, rest = [], []
    for group in dict.fromkeys(groups_B.tolist()):  # groups in order of first appearance
        rows = (groups_B == group).nonzero().flatten()
        prefix = min(common_prefix(ids_BT[rows], attention_BT[rows]), tail_start(scored_BT[rows])) if len(rows) > 1 else 0
        if prefix > 0 and (len(rows) - 1) * prefix * params >= min_saved:
            shared.append((rows, prefix))
        else:
            rest.append(rows)
    return shared, torch.cat(rest) if rest else groups_B.new_zeros(0)


def can_share(model) -> bool:
    """The model takes and returns a key/value cache here (not under gradient checkpointing while training)."""
    names, bare = forward_params(model)
    checkpointing = torch.is_grad_enabled() and getattr(bare, "is_gradient_checkpointing", False)
    return "past_key_values" in names and not checkpointing


def parameter_count(model) -> int:
    """Parameters of the model (ZeRO-3 partitions hold their full size in `ds_numel`), counted once per
    model: every learner pass asks."""
    bare = forward_params(model)[1]
    if bare not in _PARAMETERS:
        _PARAMETERS[bare] = sum(getattr(p, "ds_numel", p.numel()) for p in bare.parameters())
    return _PARAMETERS[bare]


def _shared_forward(model, ids_NT: torch.Tensor, attention_NT: torch.Tensor, scored_NT: torch.Tensor,
                    prefix: int, rows: torch.Tensor) -> Piece | None:
    n, T = ids_NT.shape
    keeps = accepts_logits_to_keep(model)
    out = model(input_ids=ids_NT[:1, :prefix], attention_mask=attention_NT[:1, :prefix], use_cache=True,
                **({"logits_to_keep": 1} if keeps else {}))
    cache = out.past_key_values
    if not hasattr(cache, "batch_repeat_interleave"):
        return None  # a cache type that cannot be repeated: the ordinary pass
    cache.batch_repeat_interleave(n)
    start = max(prefix, tail_start(scored_NT)) if keeps else prefix
    keep = {"logits_to_keep": T - start} if start > prefix else {}
    logits = model(input_ids=ids_NT[:, prefix:], attention_mask=attention_NT, past_key_values=cache, use_cache=True,
                   **keep).logits
    return Piece(rows, logits, ids_NT[:, start:], scored_NT[:, start:], start)


def forward_pieces(model, ids_BT: torch.Tensor, attention_BT: torch.Tensor, scored_BT: torch.Tensor,
                   groups_B: torch.Tensor, min_saved: float = MIN_SAVED) -> list[Piece]:
    """The micro-batch's logits in pieces: one per group sharing its prefix, one for the other rows."""
    shared, rest = (share_plan(ids_BT, attention_BT, scored_BT, groups_B.to(ids_BT.device), parameter_count(model),
                               min_saved) if can_share(model) else ([], torch.arange(len(ids_BT), device=ids_BT.device)))
    pieces = []
    for rows, prefix in shared:
        piece = _shared_forward(model, ids_BT[rows], attention_BT[rows], scored_BT[rows], prefix, rows)
        if piece is None:
            rest = torch.cat([rest, rows])
        else:
            pieces.append(piece)
    if len(rest):
        pieces.append(tail_forward(model, ids_BT[rest], attention_BT[rest], scored_BT[rest], rest))
    return pieces


def scored_logprobs(model, ids_BT: torch.Tensor, attention_BT: torch.Tensor, scored_BT: torch.Tensor,
                    groups_B: torch.Tensor, head: Callable, min_saved: float = MIN_SAVED):
    """((B, T) log pi, (B, T) entropy or None): `head(logits, ids, scored)` on each piece, back in row
    order and aligned with the ids; positions before a piece's start read 0 (nothing scored there)."""
    logps, entropies, order = [], [], []
    for piece in forward_pieces(model, ids_BT, attention_BT, scored_BT, groups_B, min_saved):
        logp, entropy = head(piece.logits, piece.ids, piece.scored)
        logps.append(pad_left(logp, piece.start))
        entropies.append(None if entropy is None else pad_left(entropy, piece.start))
        order.append(piece.rows)
    rows = torch.cat(order)
    if torch.equal(rows, torch.arange(len(rows), device=rows.device)):
        return logps[0] if len(logps) == 1 else torch.cat(logps), None if entropies[0] is None else torch.cat(entropies)
    inverse = torch.argsort(rows)
    return torch.cat(logps)[inverse], None if entropies[0] is None else torch.cat(entropies)[inverse]
