"""Which rows each rank runs in each micro-batch, and at what width: the learner's micro-batch plan.

A TrainBatch is padded to its longest row (`TrainBatch.from_episodes`). Agent episodes are ragged (one
turn beside sixteen), so cutting micro-batches by row count spends compute on padding in proportion to
the spread. With a token budget (`learner.micro_batch_tokens`), rows are sorted by length and grouped so
a micro-batch holds about the budget in tokens, each run only up to its own longest row (verl's
`use_dynamic_bsz` / `rearrange_micro_batches`). Packed (`learner.pack_sequences`), a micro-batch's rows
run as one row with positions restarting per sequence and no attention across them (OpenRLHF's
`packing_samples`): no padding at all (`packed_forward`).

Every rank holds the whole batch, so every rank computes the same plan for every rank without talking:
rows go to ranks longest first, each to the rank with the fewest tokens so far (balanced by tokens), and
every rank runs as many micro-batches as the busiest one (an empty one still runs a 1-token forward
where ZeRO-3's parameter gathers need every rank in each pass: `Learner._empty_forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Micro:
    """One micro-batch: rows of the batch, run over columns [0, width); packed: as one row of sum(lengths)."""

    rows: torch.Tensor  # (n,) long, row indices in the batch
    width: int  # the longest row's length (the batch's width in row-count mode)
    packed: bool = False

    @property
    def empty(self) -> bool:
        return len(self.rows) == 0


def row_lengths(attention_BT: torch.Tensor) -> torch.Tensor:
    """(B,) long: real tokens per right-padded row (the last attended position + 1)."""
    T = attention_BT.shape[1]
    cols = torch.arange(1, T + 1).expand_as(attention_BT)
    return (cols * attention_BT.gt(0)).amax(dim=1) if T else attention_BT.new_zeros(len(attention_BT))


def _ranks_by_tokens(order: list[int], lengths: list[int], world: int) -> list[list[int]]:
    """Rows (longest first) to ranks, each to the rank with the fewest tokens so far (ties: lowest rank)."""
    loads, out = [0] * world, [[] for _ in range(world)]
    for i in order:
        r = min(range(world), key=lambda k: (loads[k], k))
        out[r].append(i)
        loads[r] += lengths[i]
    return out


def _budget_groups(rows: list[int], lengths: list[int], budget: int, packed: bool) -> list[list[int]]:
    """Rows sorted longest first into micro-batches of at most `budget` tokens (a longer row alone).
    Padded: contiguous runs of the sorted rows, a run costing its count x its first (longest) row.
    Packed: first-fit decreasing by the sum of lengths."""
    groups: list[list[int]] = []
    if packed:
        loads: list[int] = []
        for i in rows:
            k = next((k for k, load in enumerate(loads) if load + lengths[i] <= budget), None)
            if k is None:
                groups.append([i])
                loads.append(lengths[i])
            else:
                groups[k].append(i)
                loads[k] += lengths[i]
        return groups
    for i in rows:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def plan_micro_batches(lengths_B: torch.Tensor, rows: range, world: int, micro_rows: int,
                       micro_tokens: int | None, packed: bool = False, n_micro: int | None = None) -> list[list[Micro]]:
    """[rank][k] micro-batches of `rows`, every rank the same count.

    micro_tokens None: today's row-count micro-batches: rank r takes the r-th contiguous
    equal share, cut into `n_micro` slices (`step_parts.micro_slices`; None: `micro_rows` rows each),
    each run at the width of the batch's longest row. Otherwise the token-budget plan of the module docstring."""
    T = int(lengths_B.max()) if len(lengths_B) else 0
    width_all = T if micro_tokens is None else None
    if micro_tokens is None:
        from agentrl.learner.step_parts import micro_slices

        size = len(rows) // world if world > 1 else len(rows)
        shares = [range(rows.start + r * size, rows.start + (r + 1) * size) for r in range(world)]
        if n_micro is None:  # a no-grad pass: micro_rows each, the last one short
            cuts = [[slice(i, min(i + micro_rows, s.stop)) for i in range(s.start, s.stop, micro_rows)] for s in shares]
        else:
            cuts = [micro_slices(share, n_micro) for share in shares]
        return [[Micro(torch.arange(sl.start, sl.stop), width_all if sl.stop > sl.start else 0) for sl in cut]
                for cut in cuts]
    lengths = lengths_B.tolist()
    order = sorted(rows, key=lambda i: (-lengths[i], i))
    per_rank = [_budget_groups(own, lengths, micro_tokens, packed) for own in _ranks_by_tokens(order, lengths, world)]
    count = max(max(len(g) for g in per_rank), 1)
    return [[Micro(torch.tensor(g, dtype=torch.long), max(lengths[i] for i in g), packed) for g in groups]
            + [Micro(torch.zeros(0, dtype=torch.long), 0, packed)] * (count - len(groups)) for groups in per_rank]


def owned_rows(plan: list[list[Micro]]) -> list[torch.Tensor]:
    """Each rank's rows over all its micro-batches, in the order its passes produce them."""
    return [torch.cat([m.rows for m in micros]) if micros else torch.zeros(0, dtype=torch.long) for micros in plan]


def computed_tokens(plan: list[list[Micro]], lengths_B: torch.Tensor) -> int:
    """Positions the model runs over for the plan, all ranks: rows x width, or the sum of lengths packed."""
    return sum(int(lengths_B[m.rows].sum()) if m.packed else len(m.rows) * m.width for micros in plan for m in micros)


def padding_ratio(plan: list[list[Micro]], lengths_B: torch.Tensor) -> float:
    """Tokens computed / real tokens of the plan's rows (1.0: no padding at all)."""
    real = sum(int(lengths_B[m.rows].sum()) for micros in plan for m in micros)
    return computed_tokens(plan, lengths_B) / max(real, 1)


def gather_planned(own_NT: torch.Tensor, owned: list[torch.Tensor], size: int, rank: int) -> torch.Tensor:
    """(size, T): every rank's rows of a per-row tensor placed at their batch rows, from this rank's
    `own_NT` (its rows in `owned[rank]` order). Ranks hold different row counts, so each sends its rows
    padded to the largest count."""
    out = own_NT.new_zeros((size, *own_NT.shape[1:]))
    if len(owned) == 1:
        out[owned[0].to(out.device)] = own_NT
        return out
    most = max(len(o) for o in owned)
    mine = torch.cat([own_NT, own_NT.new_zeros((most - len(own_NT), *own_NT.shape[1:]))])
    parts = [torch.empty_like(mine) for _ in owned]
    torch.distributed.all_gather(parts, mine)
    for rows, part in zip(owned, parts):
        out[rows.to(out.device)] = part[:len(rows)]
    return out
