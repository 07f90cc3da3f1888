"""`turn_grpo` and `state_grpo` (agentrl/algo/turn_baseline.py): GRPO with a baseline per turn or per state,
against a plain-Python loop reference and by hand."""

from __future__ import annotations

import statistics

import pytest
import torch

from agentrl.algo import ADVANTAGES, AdvantageInputs
from agentrl.algo.turn_baseline import turn_index
from agentrl.config import AlgoConfig


def ledger(turns: list[int], T: int) -> list[float]:
    """A row's loss mask: a 2-token prompt, then per turn `n` policy tokens and 2 env tokens."""
    row = [0.0, 0.0]
    for n in turns:
        row += [1.0] * n + [0.0, 0.0]
    return (row + [0.0] * T)[:T]


def loop_turn_grpo(rewards, groups, mask, eps=1e-6):
    out = []
    turns_of = []
    for row in mask:
        k, prev, idx = 0, 0.0, []
        for m in row:
            k += int(m > 0 and prev == 0)
            idx.append(k if m > 0 else 0)
            prev = m
        turns_of.append(idx)
    n_turns = [max(idx) for idx in turns_of]
    for b, row in enumerate(mask):
        mates = [j for j in range(len(rewards)) if groups[j] == groups[b]]
        std = statistics.stdev([rewards[j] for j in mates]) if len(mates) > 1 else 0.0
        adv = []
        for t, m in enumerate(row):
            k = turns_of[b][t]
            if m == 0:
                adv.append(0.0)
                continue
            there = [rewards[j] for j in mates if n_turns[j] >= k]
            adv.append((rewards[b] - sum(there) / len(there)) / (std + eps))
        out.append(adv)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_turn_grpo_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 12, 60
    groups = torch.randint(0, 3, (B,), generator=g)
    rows = [ledger(torch.randint(1, 4, (int(torch.randint(0, 9, (1,), generator=g)),), generator=g).tolist(), T)
            for _ in range(B)]
    mask = torch.tensor(rows, dtype=torch.float32)
    rewards = torch.rand(B, generator=g)
    got = ADVANTAGES["turn_grpo"](AdvantageInputs(rewards, groups, mask)).advantages_BT
    want = torch.tensor(loop_turn_grpo(rewards.tolist(), groups.tolist(), rows))
    assert torch.allclose(got, want, atol=1e-5)


def test_turn_grpo_by_hand():
    # One group: A found it at turn 1 (R 1), B at turn 2 (R 0.9), C at turn 3 (R 0.8), D at turn 3 (R 0.6).
    # Group mean 0.825, std 0.1708. Turn 1 is GRPO. Turn 2 baseline: mean(B, C, D) = 0.7667; turn 3: 0.7.
    # So B's winning turn 2 gets (0.9 - 0.7667) / std > 0, where GRPO gave it (0.9 - 0.825) / std.
    rewards = torch.tensor([1.0, 0.9, 0.8, 0.6])
    mask = torch.tensor([ledger([1], 12), ledger([1, 1], 12), ledger([1, 1, 1], 12), ledger([1, 1, 1], 12)])
    adv = ADVANTAGES["turn_grpo"](AdvantageInputs(rewards, torch.zeros(4, dtype=torch.long), mask)).advantages_BT
    std = statistics.stdev(rewards.tolist())
    first = [(r - 0.825) / std for r in rewards.tolist()]
    assert adv[:, 2].tolist() == pytest.approx(first, abs=1e-5)  # turn 1 of every row: GRPO
    assert float(adv[1, 5]) == pytest.approx((0.9 - 2.3 / 3) / std, abs=1e-5)
    assert float(adv[2, 8]) == pytest.approx((0.8 - 0.7) / std, abs=1e-5)
    assert float(adv[3, 8]) == pytest.approx((0.6 - 0.7) / std, abs=1e-5)
    assert (adv[mask == 0] == 0).all()


def test_turn_index_and_single_turn_is_grpo():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1], [1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    assert turn_index(mask).tolist() == [[0, 1, 1, 0, 2, 0, 0, 3], [1, 0, 0, 0, 0, 0, 0, 0]]
    g = torch.Generator().manual_seed(0)
    rewards, groups = torch.rand(8, generator=g), torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])
    one = torch.tensor([ledger([2], 8)] * 8)
    inp = AdvantageInputs(rewards, groups, one)
    assert torch.allclose(ADVANTAGES["turn_grpo"](inp).advantages_BT, ADVANTAGES["grpo"](inp).advantages_BT)


def test_selectable_by_config():
    assert AlgoConfig(advantage="turn_grpo").advantage.type == "turn_grpo"
    assert AlgoConfig(advantage="state_grpo").advantage.type == "state_grpo"


def loop_state_grpo(rewards, groups, ids, mask, eps=1e-6):
    """The state of row b at turn k: (group, every token before that turn's first token), compared as lists."""
    turn_adv = loop_turn_grpo(rewards, groups, mask, eps)
    starts = []  # per row: the position of each turn's first token
    for row in mask:
        starts.append([t for t, m in enumerate(row) if m > 0 and (t == 0 or row[t - 1] == 0)])
    out = []
    for b, row in enumerate(mask):
        mates = [j for j in range(len(rewards)) if groups[j] == groups[b]]
        std = statistics.stdev([rewards[j] for j in mates]) if len(mates) > 1 else 0.0
        adv = list(turn_adv[b])
        for k, pos in enumerate(starts[b]):
            same = [j for j in mates if len(starts[j]) > k and ids[j][:starts[j][k]] == ids[b][:pos]]
            if len(same) < 2:
                continue  # alone in its state: turn_grpo's value stands
            base = sum(rewards[j] for j in same) / len(same)
            end = starts[b][k + 1] if k + 1 < len(starts[b]) else len(row)
            for t in range(pos, end):
                if row[t] > 0:
                    adv[t] = (rewards[b] - base) / (std + eps)
        out.append(adv)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_state_grpo_matches_loop(seed):
    # Tokens from a 2-letter alphabet and 1-token turns, so rows of a group often share a state for a few turns.
    g = torch.Generator().manual_seed(seed)
    B, T = 12, 40
    groups = torch.randint(0, 2, (B,), generator=g)
    rows = [ledger([1] * int(torch.randint(1, 9, (1,), generator=g)), T) for _ in range(B)]
    mask = torch.tensor(rows, dtype=torch.float32)
    ids = torch.randint(5, 7, (B, T), generator=g)
    ids[:, :2] = 3  # the prompt
    ids[mask == 0] = torch.where(ids[mask == 0] > 5, 9, 8)  # env replies follow the guess before them
    rewards = torch.rand(B, generator=g)
    inp = AdvantageInputs(rewards, groups, mask, input_ids_BT=ids)
    got = ADVANTAGES["state_grpo"](inp).advantages_BT
    want = torch.tensor(loop_state_grpo(rewards.tolist(), groups.tolist(), ids.tolist(), rows))
    assert torch.allclose(got, want, atol=1e-5)
    assert (got != ADVANTAGES["turn_grpo"](inp).advantages_BT).any()  # state baselines ran, not only the fallback


def test_state_grpo_by_hand():
    # One group of four, 1-token turns (mask: prompt 2, then turn, env, env, ...). A and B guessed "5" at turn 1,
    # C and D "6". Turn 2: A and B are in one state (R 1.0 and 0.5: baseline 0.75); C is alone (D ended at
    # turn 1), so it keeps turn_grpo's baseline over A, B, C at turn 2: 0.7.
    rewards = torch.tensor([1.0, 0.5, 0.6, 0.2])
    mask = torch.tensor([ledger([1, 1], 8), ledger([1, 1], 8), ledger([1, 1], 8), ledger([1], 8)])
    ids = torch.tensor([[3, 3, 5, 8, 8, 7, 8, 8], [3, 3, 5, 8, 8, 6, 8, 8], [3, 3, 6, 9, 9, 7, 8, 8],
                        [3, 3, 6, 9, 9, 0, 0, 0]])
    adv = ADVANTAGES["state_grpo"](AdvantageInputs(rewards, torch.zeros(4, dtype=torch.long), mask,
                                                   input_ids_BT=ids)).advantages_BT
    std = statistics.stdev(rewards.tolist())
    assert adv[:, 2].tolist() == pytest.approx([(r - 0.575) / std for r in rewards.tolist()], abs=1e-5)  # GRPO
    assert adv[:3, 5].tolist() == pytest.approx([0.25 / std, -0.25 / std, (0.6 - 0.7) / std], abs=1e-5)
    assert (adv[mask == 0] == 0).all()
    with pytest.raises(ValueError, match="input_ids_BT"):
        ADVANTAGES["state_grpo"](AdvantageInputs(rewards, torch.zeros(4, dtype=torch.long), mask))
