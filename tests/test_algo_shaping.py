"""agentrl.algo.shaping against hand-computed numbers and slow plain-python loop references.

Random batches have multi-turn masks (env-token gaps), an all-zero row, groups of size 1 and
non-contiguous group ids; padding holds NaN/inf so a leak past the mask shows up.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from agentrl.algo import (AdaptiveKLController, FixedKLController, RunningMoments, clip_rewards,
                          informative_groups, kl_penalized_token_rewards, make_kl_controller)

NAN, INF = math.nan, math.inf


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def rand_mask(rng: random.Random, B: int, T: int) -> list[list[float]]:
    """Prompt, then generated turns separated by env tokens, then padding; row 1 has no generated tokens."""
    rows = []
    for b in range(B):
        row, n, pos = [0.0] * T, rng.randint(T // 2, T), rng.randint(1, 3)
        while pos < n and b != 1:
            gen = rng.randint(1, 4)
            row[pos:min(pos + gen, n)] = [1.0] * (min(pos + gen, n) - pos)
            pos += gen + rng.randint(1, 3)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- KL-penalised token rewards

def test_kl_penalized_token_rewards_by_hand():
    """r_t = -0.1 kl_t on generated tokens; the clipped reward (3 -> 1) lands on row 0's last generated
    token (position 4, after an env gap), the empty row 1 gets nothing, NaN/inf padding never leaks."""
    mask = t([[0, 1, 1, 0, 1], [0] * 5, [1, 1, 0, 0, 0]])
    logp = t([[NAN, -1.0, -2.0, INF, -0.5], [-1.0] * 5, [-0.2, -0.3, NAN, NAN, NAN]])
    ref = t([[0.0, -1.5, -1.0, 0.0, -2.5], [-2.0] * 5, [-0.4, -0.3, 0.0, 0.0, 0.0]])
    token_r, kl = kl_penalized_token_rewards(t([3.0, 5.0, -0.25]), logp, ref, mask, kl_coef=0.1, reward_clip=1.0)
    assert_close(kl, t([[0, 0.5, -1.0, 0, 2.0], [0] * 5, [0.2, 0, 0, 0, 0]]))
    assert_close(token_r, t([[0, -0.05, 0.1, 0, -0.2 + 1.0], [0] * 5, [-0.02, -0.25, 0, 0, 0]]))


def ref_kl_rewards(rewards, logp, ref, mask, coef, clip):
    out, kls = [], []
    for r, lp, rl, m in zip(rewards, logp, ref, mask):
        gen = [i for i, v in enumerate(m) if v > 0]
        kl = [lp[i] - rl[i] if i in gen else 0.0 for i in range(len(m))]
        row = [-coef * k for k in kl]
        if gen:
            row[gen[-1]] += r if clip is None else max(-clip, min(clip, r))
        out.append(row)
        kls.append(kl)
    return out, kls


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("reward_clip", [None, 0.5])
def test_kl_penalized_token_rewards_matches_loop(seed, reward_clip):
    """Random multi-turn masks and an empty row against the per-row loop; requires_grad inputs give
    detached outputs because rewards are targets."""
    rng = random.Random(seed)
    B, T = 7, 15
    mask = rand_mask(rng, B, T)
    logp = [[rng.uniform(-3, 0) if m else NAN for m in row] for row in mask]
    ref = [[rng.uniform(-3, 0) if m else INF for m in row] for row in mask]
    rewards = [rng.uniform(-2, 2) for _ in range(B)]
    coef = rng.uniform(0.01, 0.5)
    want_r, want_kl = ref_kl_rewards(rewards, logp, ref, mask, coef, reward_clip)
    logp_t = t(logp, torch.float64).requires_grad_()
    got_r, got_kl = kl_penalized_token_rewards(t(rewards, torch.float64), logp_t, t(ref, torch.float64),
                                               t(mask, torch.float64), coef, reward_clip)
    assert_close(got_r, t(want_r, torch.float64))
    assert_close(got_kl, t(want_kl, torch.float64))
    assert not got_r.requires_grad and not got_kl.requires_grad


# ---------------------------------------------------------------- clip_rewards

def test_clip_rewards_by_hand_and_loop():
    """None is the identity; a clip bound must be positive (0 would zero every reward silently)."""
    assert_close(clip_rewards(t([-3.0, -0.5, 0.0, 2.0]), 1.0), t([-1.0, -0.5, 0.0, 1.0]))
    x = t([5.0, -7.0])
    assert clip_rewards(x, None) is x
    rng = random.Random(0)
    xs = [rng.uniform(-4, 4) for _ in range(50)]
    assert_close(clip_rewards(t(xs, torch.float64), 1.5), t([max(-1.5, min(1.5, v)) for v in xs], torch.float64))
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError):
            clip_rewards(x, bad)


# ---------------------------------------------------------------- RunningMoments

def test_running_moments_match_numpy_over_all_batches():
    """After every batch (sizes 1..8, an empty one, a far-off mean that a naive sum-of-squares
    formula would lose precision on), mean/var/std equal numpy over the concatenation so far."""
    rng = np.random.default_rng(0)
    rm, seen = RunningMoments(), []
    for n in (1, 5, 0, 3, 8, 2, 1):
        batch = rng.normal(1e4, 3.0, size=n).astype(np.float32)
        rm.update(torch.from_numpy(batch))
        seen.extend(batch.astype(np.float64))
        assert rm.count == len(seen)
        assert_close(rm.mean, float(np.mean(seen)), rtol=1e-12, atol=0)
        assert_close(rm.var, float(np.var(seen)), rtol=1e-9, atol=0)
        assert_close(rm.std, float(np.std(seen, ddof=1)) if len(seen) > 1 else 0.0, rtol=1e-9, atol=0)


def test_running_moments_normalize_by_hand():
    """After [1, 2, 3], normalize([4, 5]) first includes 4 and 5: all = 1..5, mean 3, unbiased var
    10 / 4 = 2.5; so (x - 3) / sqrt(2.5); without the mean, x / sqrt(2.5) (with 4, 5 seen twice)."""
    rm = RunningMoments()
    rm.update(t([1.0, 2.0, 3.0]))
    assert (rm.mean, rm.var, rm.std) == (2.0, 2 / 3, 1.0)
    assert_close(rm.normalize(t([4.0, 5.0]), eps=0.0), t([1.0, 2.0]) / math.sqrt(2.5))
    rm2 = RunningMoments()
    rm2.update(t([1.0, 2.0, 3.0]))
    assert_close(rm2.normalize(t([4.0, 5.0]), subtract_mean=False, eps=0.0), t([4.0, 5.0]) / math.sqrt(2.5))


def test_running_moments_normalize_loop_and_state_dict():
    """normalize() == (x - mean) / (std + eps) over everything seen including x; a model restored
    from state_dict continues identically."""
    rng = random.Random(1)
    rm, seen = RunningMoments(), []
    for n in (4, 1, 6):
        xs = [rng.gauss(2.0, 5.0) for _ in range(n)]
        seen += xs
        mean = sum(seen) / len(seen)
        std = math.sqrt(sum((v - mean) ** 2 for v in seen) / (len(seen) - 1))
        got = rm.normalize(t(xs, torch.float64), eps=1e-3)
        assert_close(got, t([(v - mean) / (std + 1e-3) for v in xs], torch.float64))
    restored = RunningMoments()
    restored.load_state_dict(rm.state_dict())
    batch = t([0.5, -1.0, 7.0])
    assert_close(restored.normalize(batch), rm.normalize(batch))
    with pytest.raises(ValueError):
        restored.load_state_dict({"mean": 0.0})


# ---------------------------------------------------------------- KL controllers

def test_adaptive_kl_controller_by_hand():
    """init 0.1, target 6, horizon 10000:
    kl 5.4, 1000 steps: e = 5.4/6 - 1 = -0.1            -> 0.1 * (1 - 0.1 * 0.1)  = 0.099
    kl 12,   500 steps: e = 1 clipped to 0.2              -> 0.099 * (1 + 0.2 * 0.05) = 0.09999
    kl 0,   2000 steps: e = -1 clipped to -0.2            -> 0.09999 * (1 - 0.2 * 0.2) = 0.0959904"""
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    for kl, n, want in ((5.4, 1000, 0.099), (12.0, 500, 0.09999), (0.0, 2000, 0.0959904)):
        ctl.update(kl, n)
        assert_close(ctl.value, want, rtol=1e-12, atol=0)


def test_adaptive_kl_controller_matches_loop_and_restores():
    """50 random updates against trl's formula written with np.clip; state_dict restores the value."""
    rng = random.Random(2)
    ctl, value = make_kl_controller("adaptive", 0.05, target=3.0, horizon=5000), 0.05
    for _ in range(50):
        kl, n = rng.uniform(0, 8), rng.randint(1, 512)
        ctl.update(kl, n)
        value *= 1 + float(np.clip(kl / 3.0 - 1, -0.2, 0.2)) * n / 5000
        assert_close(ctl.value, value, rtol=1e-12, atol=0)
    restored = AdaptiveKLController(1.0, target=3.0, horizon=5000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_fixed_kl_controller_and_factory():
    """Fixed never moves; the factory rejects unknown kinds and an adaptive one without target/horizon."""
    ctl = make_kl_controller("fixed", 0.2, target=1.0, horizon=10)
    assert isinstance(ctl, FixedKLController)
    ctl.update(100.0, 1000)
    assert ctl.value == 0.2
    assert isinstance(make_kl_controller("adaptive", 0.2, 1.0, 10), AdaptiveKLController)
    for kwargs in ({"kind": "pid"}, {"kind": "adaptive"}, {"kind": "adaptive", "target": 0.0, "horizon": 10},
                   {"kind": "fixed", "kl_coef": -1.0}):
        with pytest.raises(ValueError):
            make_kl_controller(**{"kl_coef": 0.1, **kwargs})


# ---------------------------------------------------------------- dynamic filtering (DAPO)

def test_informative_groups_by_hand():
    """ids 5: {1, 0} informative; 9: {0, 0} all equal; 2: one episode; 7: differ by 1e-9 < eps;
    3: {0.2, 0.2, 0.7} informative."""
    ids = torch.tensor([5, 9, 5, 2, 9, 7, 7, 3, 3, 3])
    rewards = t([1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5 + 1e-9, 0.2, 0.2, 0.7], torch.float64)
    got = informative_groups(rewards, ids)
    assert got.dtype == torch.bool
    assert got.tolist() == [True, False, True, False, False, False, False, True, True, True]
    assert informative_groups(t([]), torch.tensor([], dtype=torch.long)).tolist() == []


@pytest.mark.parametrize("seed", range(5))
def test_informative_groups_matches_loop(seed):
    """Random non-contiguous ids (singletons included) and mostly 0/1 rewards, so some groups are uniform."""
    rng = random.Random(seed)
    ids = [rng.choice([3, 17, 40, 41, 99, 1000]) for _ in range(18)] + [5, 6]  # 5, 6: singletons
    rng.shuffle(ids)
    rewards = [rng.choice([0.0, 1.0, 1.0, rng.uniform(-1, 1)]) for _ in ids]
    groups = defaultdict(list)
    for g, r in zip(ids, rewards):
        groups[g].append(r)
    want = [max(groups[g]) - min(groups[g]) > 1e-6 for g in ids]
    assert informative_groups(t(rewards), torch.tensor(ids)).tolist() == want


def test_sequence_kl_sums_each_rows_masked_tokens_and_averages_the_rows():
    from agentrl.algo import sequence_kl

    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    # row 0: 0.5 - 1.0 = -0.5 (the NaN is padding, selected away); row 1: 0.5 + 0.5 = 1.0; mean 0.25
    assert sequence_kl(logp, ref, mask) == pytest.approx(0.25)
