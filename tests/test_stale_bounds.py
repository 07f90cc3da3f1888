"""Staleness-aware bounds (agentrl/algo/correction.py): the `clip` trust region with `half_life`
(bounds tightening with a token's age) and with `level: sequence` (per sequence, for GSPO) and the ESS step scale (VCPO), each
checked against a plain-Python loop reference and by hand; and their config."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.algo import POLICY_LOSSES, PolicyLossInputs, behaviour_trust_mask, importance_weights
from agentrl.algo.correction import age_scaled_eps, ess_step_scale, sequence_trust_keep
from agentrl.config import AlgoConfig


def case(seed: int, B: int = 5, T: int = 7):
    """Random log pi_theta, log mu, per-row advantages, a ragged mask and ages 0..20."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    behav = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.float64)
    age = torch.randint(0, 21, (B, T), generator=g)
    return logp, behav, adv, mask, age


def loop_aged_clip(logp, behav, adv, mask, age, eps_low, eps_high, half_life):
    keep = []
    for b in range(len(logp)):
        row = []
        for t in range(len(logp[b])):
            rho = math.exp(float(logp[b][t]) - float(behav[b][t]))
            lo = eps_low * 0.5 ** (int(age[b][t]) / half_life)
            hi = eps_high * 0.5 ** (int(age[b][t]) / half_life)
            a = float(adv[b][t])
            drop = mask[b][t] > 0 and ((a < 0 and rho < 1 - lo) or (a > 0 and rho > 1 + hi))
            row.append(0.0 if drop else 1.0)
        keep.append(row)
    return keep


def loop_sequence_clip(logp, behav, adv, mask, eps_low, eps_high):
    keep = []
    for b in range(len(logp)):
        toks = [t for t in range(len(logp[b])) if mask[b][t] > 0]
        drop = False
        if toks:
            rho = math.exp(sum(float(logp[b][t]) - float(behav[b][t]) for t in toks) / len(toks))
            a = sum(float(adv[b][t]) for t in toks) / len(toks)
            drop = (a < 0 and rho < 1 - eps_low) or (a > 0 and rho > 1 + eps_high)
        keep.append([0.0 if drop else 1.0] * len(logp[b]))
    return keep


def loop_ess(w, mask):
    ws = [math.exp(float(x)) for x, m in zip(w.flatten(), mask.flatten()) if m > 0]
    return sum(ws) ** 2 / (len(ws) * sum(x * x for x in ws)) if ws else 1.0


@pytest.mark.parametrize("seed", range(6))
def test_half_life_matches_loop(seed):
    logp, behav, adv, mask, age = case(seed)
    region = AlgoConfig(trust_region={"type": "clip", "eps_low": 0.3, "eps_high": 0.25, "half_life": 4}).trust_region
    keep = behaviour_trust_mask(logp, behav, adv, mask, region, age)
    assert keep.tolist() == loop_aged_clip(logp, behav, adv, mask, age, 0.3, 0.25, 4.0)


@pytest.mark.parametrize("seed", range(6))
def test_sequence_level_matches_loop(seed):
    logp, behav, adv, mask, _ = case(seed)
    region = AlgoConfig(trust_region={"type": "clip", "eps_low": 0.1, "eps_high": 0.15, "level": "sequence"}).trust_region
    keep = behaviour_trust_mask(logp, behav, adv, mask, region)
    assert keep.tolist() == loop_sequence_clip(logp, behav, adv, mask, 0.1, 0.15)


@pytest.mark.parametrize("seed", range(6))
def test_ess_step_scale_matches_loop(seed):
    logp, behav, _, mask, _ = case(seed)
    corr = AlgoConfig(correction={"type": "tis", "ess_step": True}).correction
    iw = importance_weights(logp, behav, mask, corr)
    assert ess_step_scale(iw) == pytest.approx(loop_ess(logp - behav, mask), rel=1e-9)


def test_half_life_by_hand():
    # rho = 0.85 with A < 0: inside clip's 0.8 at age 0, outside once eps has halved (age 8: eps 0.1 -> 0.9).
    # rho = 1.15 with A > 0: the same on the upper side. Age 16 quarters eps: rho 0.96 (A < 0) stays in at 0.95.
    logp = torch.zeros(1, 5, dtype=torch.float64)
    behav = -torch.log(torch.tensor([[0.85, 0.85, 1.15, 1.15, 0.96]], dtype=torch.float64))
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.float64)
    region = AlgoConfig(trust_region={"type": "clip", "half_life": 8}).trust_region  # eps 0.2
    keep = behaviour_trust_mask(logp, behav, adv, mask, region, torch.tensor([[0, 8, 0, 8, 16]]))
    assert keep.tolist() == [[1.0, 0.0, 1.0, 0.0, 1.0]]
    assert age_scaled_eps(0.2, torch.tensor([0.0, 8.0, 16.0]), 8.0).tolist() == pytest.approx([0.2, 0.1, 0.05])


def test_half_life_at_age_zero_is_clip():
    # On-policy (every age 0, or no ages given) clip with a half_life keeps exactly what fixed clip keeps: at staleness 0 it is
    # the shipped trust region.
    for seed in range(4):
        logp, behav, adv, mask, age = case(seed)
        clip = behaviour_trust_mask(logp, behav, adv, mask, AlgoConfig(trust_region="clip").trust_region)
        aged = AlgoConfig(trust_region={"type": "clip", "half_life": 8}).trust_region
        assert torch.equal(behaviour_trust_mask(logp, behav, adv, mask, aged, torch.zeros_like(age)), clip)
        assert torch.equal(behaviour_trust_mask(logp, behav, adv, mask, aged), clip)


def test_ess_step_scales_the_loss_and_its_gradient():
    # Weights w = pi_old / mu = [1, 1, 4] (tis caps the applied one at 2): ESS = 36 / (3 * 18) = 2/3.
    logp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    behav = -torch.log(torch.tensor([[1.0, 1.0, 4.0]], dtype=torch.float64))
    adv = torch.ones(1, 3, dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    base = AlgoConfig(correction={"type": "tis"}, trust_region="none")
    scaled = AlgoConfig(correction={"type": "tis", "ess_step": True}, trust_region="none")
    inp = PolicyLossInputs(logp, logp.detach(), behav, adv, mask)
    loss0, m0, *_ = POLICY_LOSSES["ppo_clip"](inp, base)
    loss1, m1, *_ = POLICY_LOSSES["ppo_clip"](inp, scaled)
    assert float(loss0.detach()) == pytest.approx(-(1 + 1 + 2) / 3)
    assert float(loss1.detach()) == pytest.approx(float(loss0.detach()) * 2 / 3)
    assert m1["ess_step_scale"] == pytest.approx(2 / 3) and "ess_step_scale" not in m0
    g0, = torch.autograd.grad(loss0, logp)
    g1, = torch.autograd.grad(loss1, logp)
    assert torch.allclose(g1, g0 * 2 / 3)


def test_gspo_with_a_sequence_trust_region_drops_whole_rows():
    # Row 0: tokens' rho 0.5 and 1.0 -> rho_i = sqrt(0.5) = 0.707 < 0.8 with A < 0: dropped whole (both
    # tokens), though token-level clip would keep the rho = 1 token. Row 1: the same ratios with A > 0: kept.
    logp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    behav = -torch.log(torch.tensor([[0.5, 1.0], [0.5, 1.0]], dtype=torch.float64))
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    keep = sequence_trust_keep(logp.detach() - behav, adv, mask, 0.2, 0.2)
    assert keep.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    cfg = AlgoConfig(policy_loss="gspo", trust_region={"type": "clip", "level": "sequence"}, correction="none",
                     agg="seq_mean_token_mean")
    loss, m, *_ = POLICY_LOSSES["gspo"](PolicyLossInputs(logp, logp.detach(), behav, adv, mask), cfg)
    assert m["trust_masked_frac"] == pytest.approx(0.5)
    g, = torch.autograd.grad(loss, logp)
    assert g[0].abs().sum() == 0 and g[1].abs().sum() > 0


@pytest.mark.parametrize("bad", [{"type": "clip", "half_life": 0}, {"type": "neg_clip", "half_life": 4},
                                 {"type": "clip", "level": "batch"},
                                 {"type": "clip", "level": "sequence", "half_life": 4}])
def test_config_rejects(bad):
    with pytest.raises(ValueError):
        AlgoConfig(trust_region=bad)


def test_random_ages_half_life_never_keeps_more_than_clip():
    # Tightening with age only ever drops more: a token kept with a half_life is kept under clip.
    rng = random.Random(0)
    for seed in range(10):
        logp, behav, adv, mask, _ = case(seed)
        age = torch.tensor([[rng.randint(0, 32) for _ in range(logp.shape[1])] for _ in range(logp.shape[0])])
        clip = behaviour_trust_mask(logp, behav, adv, mask, AlgoConfig(trust_region="clip").trust_region)
        aged = behaviour_trust_mask(logp, behav, adv, mask, AlgoConfig(trust_region={"type": "clip", "half_life": 8}).trust_region, age)
        assert bool((aged <= clip).all())
