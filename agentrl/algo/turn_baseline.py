"""`turn_grpo` and `state_grpo`: GRPO with a baseline per turn, for multi-turn episodes scored once at the end.

GRPO gives every token of an episode the same advantage (R_i - mean_g R) / std_g. In a long multi-turn
episode that spreads one number over every turn: in bench/scale_out.py's 16-turn guess-the-number, a
correct guess at turn 9 of an episode that took 9 turns is pushed down as hard as the wasted guesses
before it, and the guesses of turns 5-16 (where the warm-started policy ignores the feedback more than
half the time, docs/benchmarks.md "Staleness") only ever see "long episode: bad". The fix is the one
GiGPO (Feng et al. 2025) makes with anchor states: compare a turn with the same turn of the episodes
of the same task that got that far. Here the turn's state is approximated by (task, turn index):

    A_{i,t} = (R_i - b_{g,k(t)}) / (std_g + eps),   b_{g,k} = mean { R_j : j in group g, K_j >= k }

k(t) is the turn (1-based) of token t, K_j the number of turns episode j took, std_g GRPO's group std
over all of the group's episodes. Reaching turn k depends only on the actions before it, so b_{g,k} is
a state-dependent baseline for the actions of turn k (up to the episode's own reward being in the mean,
as in GRPO). Turn 1 is GRPO exactly; an episode alone at its turn k gets 0 there. When a reward is
mostly a function of how many turns were used (a turn penalty), episodes that reached turn k have paid
the same cost so far, so b_{g,k} takes the past out and the turn is judged by what followed it.

Turns are read from the loss mask: a turn is a run of consecutive policy tokens (mask 1), turns are
separated by env/tool tokens (mask 0). Reads rewards_B, group_ids_B, mask_BT.

`state_grpo` takes the state exactly, as GiGPO's anchor states do: the episodes of group g whose tokens
before turn k are identical (same guesses, so the same replies) are in one state s, and

    A_{i,t} = (R_i - b_{g,s(i,k)}) / (std_g + eps),   b_{g,s} = mean { R_j : j in group g, in state s at turn k }

for an episode that shares its state with another one; an episode alone in its state keeps turn_grpo's
b_{g,k}. Why: turn_grpo's b_{g,k} mixes states, so a turn-3 guess in an episode whose first two guesses left
a wide range is judged by those guesses too; on the 16-turn workload the midpoint share of turn-3 guesses
stayed at 0.37-0.40 over 120 steps while turn 1 went 0.36 -> 0.85 (docs/benchmarks.md, "Staleness"). Within
one state only the turn's own choice and what followed it differ. Turn 1 is GRPO again (one state per task).
Also reads input_ids_BT. Measured there (seed 0, 120 steps): turn 3 still ended at 0.37 and the held-out
score at 0.767 against turn_grpo's 0.786. The workload's estimator is PPO's GAE now: a critic gained +0.0496
over seeds 0-2 where turn_grpo gained +0.035, +0.062 with two optimizer steps a batch (docs/benchmarks.md,
"Staleness").
"""

from __future__ import annotations

import torch

from .advantages import AdvantageInputs, AdvantageOutput, _group_stats, register_advantage


def turn_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) long: the 1-based turn of each masked token (a turn = a run of mask 1), 0 off the mask."""
    on_BT = mask_BT > 0
    prev_BT = torch.zeros_like(on_BT)
    prev_BT[:, 1:] = on_BT[:, :-1]
    starts_BT = on_BT & ~prev_BT
    return torch.where(on_BT, starts_BT.long().cumsum(-1), 0)


def _turn_advantages(inp: AdvantageInputs, by_state: bool) -> AdvantageOutput:
    mask_BT, rewards_B = inp.mask_BT, inp.rewards_B.double()
    turn_BT = turn_index(mask_BT)
    turns_B = turn_BT.max(-1).values if turn_BT.numel() else turn_BT.new_zeros(len(rewards_B))
    K = int(turns_B.max()) if turns_B.numel() else 0
    _, std_B, _, _ = _group_stats(rewards_B, inp.group_ids_B)
    if K == 0:
        return AdvantageOutput(advantages_BT=torch.zeros_like(mask_BT))
    _, inv_B = torch.unique(inp.group_ids_B, return_inverse=True)
    reached_BK = (turns_B[:, None] >= torch.arange(1, K + 1, device=turns_B.device)[None]).double()
    n_groups = int(inv_B.max()) + 1
    zeros_GK = torch.zeros(n_groups, K, dtype=torch.float64, device=rewards_B.device)
    sum_GK = zeros_GK.index_add(0, inv_B, reached_BK * rewards_B[:, None])
    count_GK = zeros_GK.index_add(0, inv_B, reached_BK)
    base_BK = (sum_GK / count_GK.clamp_min(1))[inv_B]
    if by_state:
        if inp.input_ids_BT is None:
            raise ValueError("state_grpo needs the batch's token ids (AdvantageInputs.input_ids_BT)")
        base_BK = state_baselines(rewards_B, inp.group_ids_B, turn_BT, inp.input_ids_BT, base_BK)
    base_BT = base_BK.gather(1, (turn_BT - 1).clamp_min(0))
    adv_BT = (rewards_B[:, None] - base_BT) / (std_B[:, None] + inp.eps)
    return AdvantageOutput(advantages_BT=(adv_BT * (turn_BT > 0)).to(mask_BT.dtype) * mask_BT)


@register_advantage("turn_grpo")
def turn_grpo(inp: AdvantageInputs) -> AdvantageOutput:
    """GRPO with the baseline of each turn taken over the group's episodes that reached that turn."""
    return _turn_advantages(inp, by_state=False)


@register_advantage("state_grpo")
def state_grpo(inp: AdvantageInputs) -> AdvantageOutput:
    """GRPO with the baseline of each turn taken over the group's episodes in the same state at that turn."""
    return _turn_advantages(inp, by_state=True)


def state_baselines(rewards_B: torch.Tensor, group_ids_B: torch.Tensor, turn_BT: torch.Tensor,
                    input_ids_BT: torch.Tensor, fallback_BK: torch.Tensor) -> torch.Tensor:
    """(B, K) float64: per row and turn, the mean reward of the group's rows with the same tokens before that
    turn's first token, or fallback_BK where the row is alone in that state (and where it has no turn k)."""
    base_BK = fallback_BK.clone()
    turn, ids, groups = turn_BT.cpu(), input_ids_BT.cpu(), group_ids_B.tolist()
    members: dict[tuple, list[tuple[int, int]]] = {}
    for b in range(turn.shape[0]):
        starts = torch.nonzero((turn[b, 1:] > 0) & (turn[b, 1:] != turn[b, :-1])).flatten() + 1
        firsts = ([0] if turn.shape[1] and turn[b, 0] > 0 else []) + starts.tolist()
        for k, pos in enumerate(firsts):
            members.setdefault((groups[b], k, ids[b, :pos].numpy().tobytes()), []).append((b, k))
    rewards = rewards_B.double()
    for rows in members.values():
        if len(rows) > 1:
            mean = sum(float(rewards[b]) for b, _ in rows) / len(rows)
            for b, k in rows:
                base_BK[b, k] = mean
    return base_BK
