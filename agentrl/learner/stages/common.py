"""What the stage kinds share: sequences laid out in the rows of one forward pass (padded, one a row, or
packed several a row), per-sequence log-probabilities of the trained tokens, and writing the trained
module as a Hugging Face folder.

Packing puts several sequences into one row of at most `max_len` tokens. Each sequence's position ids
restart at 0 and no attention mask is passed: transformers (masking_utils.find_packed_sequence_indices)
then builds a block-diagonal causal mask, so a token attends only to its own sequence and every logit or
hidden state read inside a sequence is the one its own padded row gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from agentrl.algo.logprobs import token_logprobs
from agentrl.utils.padding import pad_tokens


def pack(items: list, max_len: int, size: Callable[[object], int] = lambda s: len(s.tokens)) -> list[list]:
    """Greedy first-fit in order: consecutive items share a row while their total `size` stays <= max_len
    (an item longer than max_len gets a row of its own)."""
    rows: list[list] = []
    used = max_len + 1
    for item in items:
        if used + size(item) > max_len:
            rows.append([])
            used = 0
        rows[-1].append(item)
        used += size(item)
    return rows


@dataclass(frozen=True)
class Rows:
    """Token sequences laid out in the rows of one forward pass."""

    ids: torch.Tensor  # (R, T) right-padded with the pad id
    attn: torch.Tensor  # (R, T) 1 on real tokens
    pos: torch.Tensor  # (R, T) position ids restarting at 0 at each sequence (and at the padding)
    spans: list[tuple[int, int, int]]  # per sequence, in input order: (row, column of its first token, length)
    packed: bool  # several sequences a row: forward with `pos` and no mask, else with `attn`

    def inputs(self, device) -> dict:
        """Keyword arguments of the model's forward for these rows."""
        extra = {"position_ids": self.pos.to(device)} if self.packed else {"attention_mask": self.attn.to(device)}
        return {"input_ids": self.ids.to(device), "use_cache": False, **extra}

    def at(self, offsets: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) index tensors of positions given per sequence relative to its first token, in order."""
        rows = [r for (r, _, _), offs in zip(self.spans, offsets) for _ in offs]
        cols = [c + o for (_, c, _), offs in zip(self.spans, offsets) for o in offs]
        return (torch.tensor(rows, dtype=torch.long, device=device),
                torch.tensor(cols, dtype=torch.long, device=device))


def lay_out(rows: list[list[list[int]]], pad_id: int, packed: bool) -> Rows:
    """`rows` of token sequences as right-padded tensors with each sequence's position ids from 0."""
    ids, attn = pad_tokens([[t for seq in row for t in seq] for row in rows], pad_id)
    T = ids.shape[1]
    pos, spans = [], []
    for r, row in enumerate(rows):
        p: list[int] = []
        for seq in row:
            spans.append((r, len(p), len(seq)))
            p += range(len(seq))
        # padding continues the positions of one more "sequence", so it never joins the last real one
        p += range(T - len(p))
        pos.append(p)
    return Rows(ids, attn, torch.tensor(pos, dtype=torch.long), spans, packed)


def sequence_rows(seqs: list[list[int]], pad_id: int, max_len: int | None) -> Rows:
    """`max_len` None: the padded batch, one sequence a row; else the sequences packed in order into
    rows of at most `max_len` tokens."""
    if max_len is None:
        return lay_out([[s] for s in seqs], pad_id, packed=False)
    groups = pack(list(range(len(seqs))), max_len, size=lambda i: len(seqs[i]))
    return lay_out([[seqs[i] for i in g] for g in groups], pad_id, packed=True)


def sequence_logprobs(engine, seqs: list, pad_id: int, max_len: int | None = None) -> torch.Tensor:
    """(N,) per sample of `seqs`, the sum over its masked tokens of log p(token | tokens before it), at
    temperature 1: the sequence log-probability DPO and KTO compare between the policy and the reference.
    Packed into rows of `max_len` tokens when given. A sequence's first token has nothing before it (in a
    packed row the previous sequence's last token would predict it): it is never counted."""
    rows = sequence_rows([s.tokens for s in seqs], pad_id, max_len)
    device = engine.device
    logits = engine(**rows.inputs(device)).logits.float()
    logp_BT = token_logprobs(logits, rows.ids.to(device), 1.0)
    # Each sequence's weights laid out in a (N, T) row of its own (a packed row holds several), written
    # from flat index lists in one assignment: no per-sequence tensor or kernel, and no N x T Python list.
    # The reduction stays a row sum over (N, T), the same summation order packed or padded.
    seq_i, col_i, weight = [], [], []
    for i, ((_, c, n), s) in enumerate(zip(rows.spans, seqs)):
        seq_i += [i] * (n - 1)
        col_i += range(c + 1, c + n)
        weight += s.mask[1:n]
    weights_NT = torch.zeros(len(seqs), logp_BT.shape[1], device=device)
    at_seq, at_col = torch.tensor([seq_i, col_i], dtype=torch.long, device=device)
    weights_NT[at_seq, at_col] = torch.tensor(weight, dtype=torch.float32, device=device)
    row_N = torch.tensor([r for r, _, _ in rows.spans], dtype=torch.long, device=device)
    return (logp_BT[row_N] * weights_NT).sum(-1)


def save_module(module: torch.nn.Module, out_dir: Path, tokenizer, zero3: bool) -> None:
    """`module.save_pretrained` in float32 with the tokenizer: a full model, or for a peft model its
    adapter (merged into a full model by `python -m agentrl.lora_merge`). Under ZeRO-3 the weights are
    gathered first, a collective every rank joins; rank 0 writes."""
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=zero3):
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        state = {k: v.detach().to("cpu", torch.float32) for k, v in module.state_dict().items()}
        module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
