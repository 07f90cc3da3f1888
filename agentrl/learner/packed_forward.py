"""A micro-batch's rows as one packed row: no padding, positions restarting per sequence.

Transformers (5.x, `masking_utils.find_packed_sequence_indices`) reads a packed row from position_ids
when no 2D attention mask is given: a position that does not follow its predecessor by 1 starts a new
sequence, and the causal mask becomes block-diagonal (SDPA and eager: a dense (N, N) mask; flash-
attention 2/3: the varlen kernels with cu_seqlens taken from the positions, nothing materialised).
Positions restart at 0 in each sequence, so rotary embeddings see what the padded row saw.

The critic's `ValueModel` runs packed the same way (`packed_values`): its body reads the same positions.

Only the logits a scored token reads are computed: `logits_to_keep` takes the index of every position
just before a scored token (the logit tail of `logit_tail`, exactly: no prompt, env or padding logits).
"""

from __future__ import annotations

from typing import Callable

import torch

from agentrl.learner.logit_tail import accepts_logits_to_keep


def packed_inputs(ids_NT: torch.Tensor, lengths_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """((1, S) ids, (1, S) positions restarting at 0 per row, (N, T) bool: the real positions), S = sum(lengths)."""
    T = ids_NT.shape[1]
    cols = torch.arange(T, device=ids_NT.device).expand_as(ids_NT)
    real = cols < lengths_N.to(ids_NT.device)[:, None]
    return ids_NT[real][None], cols[real][None], real


def unpack(values_1S: torch.Tensor, real_NT: torch.Tensor) -> torch.Tensor:
    """(N, T) from a packed (1, S) row: each row's values at its real positions, 0 after."""
    out = values_1S.new_zeros(real_NT.shape)
    out[real_NT] = values_1S[0]
    return out


def packed_values(critic, ids_NT: torch.Tensor, lengths_N: torch.Tensor) -> torch.Tensor:
    """(N, T) the critic's value at each real position of each row, 0 after, from one packed forward."""
    flat_ids, positions, real = packed_inputs(ids_NT, lengths_N)
    return unpack(critic(input_ids=flat_ids, position_ids=positions), real)


def packed_logprobs(model, ids_NT: torch.Tensor, lengths_N: torch.Tensor, scored_NT: torch.Tensor,
                    head: Callable) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((N, T) log pi at the scored positions, 0 elsewhere; (N, T) entropy there or None) from one packed
    forward. `head(logits, ids, scored)` reads the logits at s - 1 for the token at s (`policy_head`), so it
    gets the kept logits in order, one spare at the end, and the targets one place to the right."""
    flat_ids, positions, real = packed_inputs(ids_NT, lengths_N)
    starts = torch.cumsum(lengths_N.to(ids_NT.device), 0) - lengths_N.to(ids_NT.device)
    scored = scored_NT.gt(0) & real
    scored[:, 0] = False  # the first token of a row has no logits before it (the padded path scores it 0)
    r, t = scored.nonzero(as_tuple=True)
    before = starts[r] + t - 1  # the packed position whose logits predict token (r, t)
    index = torch.cat([before, before.new_zeros(1)])  # the spare: the head reads no target for it
    if accepts_logits_to_keep(model):
        logits = model(input_ids=flat_ids, position_ids=positions, use_cache=False, logits_to_keep=index).logits
    else:
        logits = model(input_ids=flat_ids, position_ids=positions, use_cache=False).logits[:, index]
    targets = torch.cat([flat_ids[0, :1], ids_NT[r, t]])[None]
    marks = torch.ones_like(targets, dtype=scored_NT.dtype)
    marks[0, 0] = 0
    logp_1K, entropy_1K = head(logits, targets, marks)
    # Keep the graph even when nothing is scored: the micro-step's loss must reach backward.
    logp = logp_1K.new_zeros(ids_NT.shape) + (logp_1K.sum() * 0.0 if len(r) == 0 else 0.0)
    logp[r, t] = logp_1K[0, 1:]
    if entropy_1K is None:
        return logp, None
    entropy = entropy_1K.new_zeros(ids_NT.shape)
    entropy[r, t] = entropy_1K[0, 1:]
    return logp, entropy
