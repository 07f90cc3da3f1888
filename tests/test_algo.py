"""agentrl.algo against hand-computed numbers and slow pure-python loop references.

Random batches have ragged rows (right padding), masks with holes (env tokens between turns), an
empty row, groups of size 1 and non-contiguous group ids; padding holds garbage to catch leaks.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from agentrl.algo import (ADVANTAGES, POLICY_LOSSES, AdvantageInputs, PolicyLossInputs,
                          behaviour_trust_mask,
                          aggregate, kl_estimate, masked_mean, register_advantage, register_policy_loss,
                          value_loss)
from agentrl.config import AlgoConfig

F64 = torch.float64


def loss_cfg(correction: str = "tis", correction_level: str = "token", is_low: float = 0.5, is_high: float = 2.0,
             trust_region: str = "clip", m2_tau: float = 0.04, **kw) -> AlgoConfig:
    """Loss settings as the learner passes them: the config tree's `algo`, its defaults overridden by `kw`.
    The correction's settings go into `algo.correction` where its type has them; the trust region's
    into `algo.trust_region`, its bounds those of PPO's clip (clip_low / clip_high) as these cases were
    computed with, m2_tau its tau (a setting the chosen type lacks is rejected by the config tree)."""
    corr = {"type": correction}
    if correction != "none":
        corr.update(level=correction_level, high=is_high)
    if correction == "mask":
        corr["low"] = is_low
    region = {"type": trust_region}
    if trust_region in ("clip", "neg_clip"):
        region["eps_low"] = kw.get("clip_low", 0.2)
    if trust_region == "clip":
        region["eps_high"] = kw.get("clip_high", 0.2)
    if trust_region == "m2":
        region["tau"] = m2_tau
    return AlgoConfig(correction=corr, trust_region=region, **kw)


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- random batches

def rand_mask(rng: random.Random, B: int, T: int) -> list[list[float]]:
    """Each row: prompt, then turns of generated tokens separated by env tokens, then padding."""
    rows = []
    for b in range(B):
        row, n = [0.0] * T, rng.randint(T // 2, T)
        pos = rng.randint(1, 3)
        while pos < n and b != 1:  # row 1 stays empty (no generated tokens)
            gen = rng.randint(1, 4)
            for k in range(pos, min(pos + gen, n)):
                row[k] = 1.0
            pos += gen + rng.randint(1, 3)
        rows.append(row)
    return rows


def rand_batch(seed: int, B: int = 9, T: int = 14):
    rng = random.Random(seed)
    ids = [100, 100, 7, 42, 7, 100, 3, 42, 7][:B]  # sizes 3, 3, 2, 1; ids not contiguous
    rng.shuffle(ids)
    mask = rand_mask(rng, B, T)
    rewards = [rng.choice([0.0, 1.0, rng.uniform(-2, 2)]) for _ in range(B)]
    return rng, ids, mask, rewards


# ---------------------------------------------------------------- reference advantages

def ref_scalar_adv(name: str, rewards: list[float], ids: list[int], eps: float) -> list[float]:
    groups = defaultdict(list)
    for r, g in zip(rewards, ids):
        groups[g].append(r)

    def whiten(xs):
        if len(xs) < 2:
            return [0.0] * len(xs)
        m = sum(xs) / len(xs)
        s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
        return [(x - m) / (s + eps) for x in xs]

    out = []
    for r, g in zip(rewards, ids):
        vals, n = groups[g], len(groups[g])
        mean = sum(vals) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
        out.append({"grpo": (r - mean) / (std + eps), "dr_grpo": r - mean,
                    "rloo": r - (sum(vals) - r) / (n - 1) if n > 1 else 0.0,
                    "reinforce_pp_baseline": r - mean, "reinforce_pp": r}[name])
    return whiten(out) if name.startswith("reinforce_pp") else out


def ref_gae(rewards, mask, values, token_rewards, gamma, lam):
    adv = [[0.0] * len(row) for row in mask]
    ret = [[0.0] * len(row) for row in mask]
    for b, row in enumerate(mask):
        idx = [k for k, m in enumerate(row) if m]
        r = [token_rewards[b][k] for k in idx] if token_rewards else [0.0] * len(idx)
        if idx and not token_rewards:
            r[-1] = rewards[b]
        a_next, v_next = 0.0, 0.0
        for j in reversed(range(len(idx))):
            k = idx[j]
            a_next = r[j] + gamma * v_next - values[b][k] + gamma * lam * a_next
            v_next = values[b][k]
            adv[b][k], ret[b][k] = a_next, a_next + values[b][k]
    return adv, ret


# ---------------------------------------------------------------- advantage tests

GROUP_IDS = [7, 3, 7, 7, 3, 9]
GROUP_REWARDS = [2.0, 1.0, 0.0, 4.0, 1.0, 5.0]  # group 7: {2, 0, 4}, group 3: {1, 1}, group 9: {5}
HAND_SCALAR = {
    # group 7: mean 2, unbiased std sqrt((0 + 4 + 4) / 2) = 2; equal rewards and singletons -> 0
    "grpo": [0.0, 0.0, -2 / (2 + 1e-6), 2 / (2 + 1e-6), 0.0, 0.0],
    "dr_grpo": [0.0, 0.0, -2.0, 2.0, 0.0, 0.0],
    # leave-one-out baselines in group 7: (0+4)/2 = 2, (2+4)/2 = 3, (2+0)/2 = 1
    "rloo": [0.0, 0.0, -3.0, 3.0, 0.0, 0.0],
}


@pytest.mark.parametrize("name", sorted(HAND_SCALAR))
def test_group_advantages_hand(name):
    mask = t([[1, 1, 0, 1]] * 6)
    mask[4] = t([1, 0, 0, 0])
    out = ADVANTAGES[name](AdvantageInputs(t(GROUP_REWARDS), torch.tensor(GROUP_IDS), mask))
    assert_close(out.advantages_BT, t(HAND_SCALAR[name])[:, None] * mask)
    assert out.returns_BT is None


def test_reinforce_pp_hand():
    mask = t([[1.0, 1.0]] * 4)
    # rewards 1..4: mean 2.5, unbiased std sqrt(5/3) = 1.2909944
    out = ADVANTAGES["reinforce_pp"](AdvantageInputs(t([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 0, 1, 1]), mask))
    assert_close(out.advantages_BT[:, 0], t([-1.161895, -0.387298, 0.387298, 1.161895]))
    # minus group means {2, 2}: [-1, 1, -2, 2]; batch std sqrt(10/3) = 1.8257419
    inp = AdvantageInputs(t([1.0, 3.0, 0.0, 4.0]), torch.tensor([5, 5, 2, 2]), mask)
    out = ADVANTAGES["reinforce_pp_baseline"](inp)
    assert_close(out.advantages_BT[:, 0], t([-0.547723, 0.547723, -1.095445, 1.095445]))


def test_grpo_equal_rewards_exactly_zero():
    out = ADVANTAGES["grpo"](AdvantageInputs(t([0.1, 0.1, 0.1]), torch.tensor([4, 4, 4]), torch.ones(3, 2)))
    assert torch.equal(out.advantages_BT, torch.zeros(3, 2))


def test_gae_hand():
    # row 0: generated at 0, 1, 3 (an env token at 2); reward 1 lands on position 3.
    #   t=3: delta = 1 - 0.2 = 0.8                          A = 0.8
    #   t=1: delta = 0.9*0.2 - 0.4 = -0.22                  A = -0.22 + 0.72*0.8 = 0.356
    #   t=0: delta = 0.9*0.4 - 0.5 = -0.14                  A = -0.14 + 0.72*0.356 = 0.11632
    # row 1: generated at 0, 1 then padding; reward 0, V = 1:  A = [-0.1 + 0.72*(-1), -1]
    mask = t([[1, 1, 0, 1, 0], [1, 1, 0, 0, 0]])
    values = t([[0.5, 0.4, 9.0, 0.2, 9.0], [1.0, 1.0, 9.0, 9.0, 9.0]])
    inp = AdvantageInputs(t([1.0, 0.0]), torch.tensor([0, 0]), mask, values_BT=values, gamma=0.9, lam=0.8)
    out = ADVANTAGES["gae"](inp)
    assert_close(out.advantages_BT, t([[0.11632, 0.356, 0, 0.8, 0], [-0.82, -1.0, 0, 0, 0]]))
    assert_close(out.returns_BT, t([[0.61632, 0.756, 0, 1.0, 0], [0.18, 0.0, 0, 0, 0]]))


def test_gae_whitened_hand():
    # test_gae_hand's advantages on the 5 generated tokens: 0.11632, 0.356, 0.8, -0.82, -1.0
    #   mean = -0.54768 / 5 = -0.109536
    #   deviations 0.225856, 0.465536, 0.909536, -0.710464, -0.890464; squares sum 2.392676 (n - 1 = 4)
    #   std = sqrt(0.598169) = 0.773414...; whitened = deviation / (std + 1e-6)
    mask = t([[1, 1, 0, 1, 0], [1, 1, 0, 0, 0]])
    values = t([[0.5, 0.4, 9.0, 0.2, 9.0], [1.0, 1.0, 9.0, 9.0, 9.0]])
    inp = AdvantageInputs(t([1.0, 0.0]), torch.tensor([0, 0]), mask, values_BT=values, gamma=0.9, lam=0.8,
                          whiten=True)
    out = ADVANTAGES["gae"](inp)
    std = 0.598169 ** 0.5 + 1e-6
    dev = [[0.225856, 0.465536, 0, 0.909536, 0], [-0.710464, -0.890464, 0, 0, 0]]
    assert_close(out.advantages_BT, t([[d / std for d in row] for row in dev]))
    assert_close(out.returns_BT, t([[0.61632, 0.756, 0, 1.0, 0], [0.18, 0.0, 0, 0, 0]]))  # targets unwhitened
    assert (out.advantages_BT[mask == 0] == 0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_gae_is_exactly_zero_where_the_mask_is_zero_whatever_the_values_there(bad):
    # The hand case above with padded / env positions holding NaN or inf values and token rewards:
    # the critic's targets there must be 0, not NaN (NaN * 0 = NaN would poison the critic's gradients).
    mask = t([[1, 1, 0, 1, 0], [1, 1, 0, 0, 0]])
    values = t([[0.5, 0.4, bad, 0.2, bad], [1.0, 1.0, bad, bad, bad]])
    tok = t([[0.0, 0.0, bad, 1.0, bad], [0.0, 0.0, bad, bad, bad]])
    inp = AdvantageInputs(t([1.0, 0.0]), torch.tensor([0, 0]), mask, values_BT=values, token_rewards_BT=tok,
                          gamma=0.9, lam=0.8)
    out = ADVANTAGES["gae"](inp)
    assert_close(out.advantages_BT, t([[0.11632, 0.356, 0, 0.8, 0], [-0.82, -1.0, 0, 0, 0]]))
    assert_close(out.returns_BT, t([[0.61632, 0.756, 0, 1.0, 0], [0.18, 0.0, 0, 0, 0]]))
    assert (out.returns_BT[mask == 0] == 0).all() and (out.advantages_BT[mask == 0] == 0).all()


@pytest.mark.parametrize("name,seed", list(itertools.product(
    ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"], range(4))))
def test_scalar_advantages_vs_reference(name, seed):
    _, ids, mask, rewards = rand_batch(seed)
    out = ADVANTAGES[name](AdvantageInputs(t(rewards, F64), torch.tensor(ids), t(mask, F64)))
    ref = ref_scalar_adv(name, rewards, ids, 1e-6)
    assert_close(out.advantages_BT, t([[a * m for m in row] for a, row in zip(ref, mask)], F64))


@pytest.mark.parametrize("seed,per_token,gamma,lam,whiten", [
    (0, False, 1.0, 1.0, False), (1, False, 0.9, 0.95, False), (2, True, 0.99, 0.9, False),
    (3, True, 1.0, 0.5, False), (4, False, 1.0, 0.95, True), (5, True, 0.9, 0.8, True)])
def test_gae_vs_reference(seed, per_token, gamma, lam, whiten):
    rng, ids, mask, rewards = rand_batch(seed)
    values = [[rng.uniform(-1, 1) for _ in row] for row in mask]
    tok = [[rng.uniform(-1, 1) for _ in row] for row in mask] if per_token else None
    inp = AdvantageInputs(t(rewards, F64), torch.tensor(ids), t(mask, F64), values_BT=t(values, F64),
                          token_rewards_BT=t(tok, F64) if tok else None, gamma=gamma, lam=lam, whiten=whiten)
    out = ADVANTAGES["gae"](inp)
    adv, ret = ref_gae(rewards, mask, values, tok, gamma, lam)
    if whiten:  # over the generated tokens only, unbiased std, 0 elsewhere
        flat = [a for a_row, m_row in zip(adv, mask) for a, m in zip(a_row, m_row) if m]
        mean = sum(flat) / len(flat)
        std = (sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)) ** 0.5
        adv = [[(a - mean) / (std + 1e-6) if m else 0.0 for a, m in zip(a_row, m_row)]
               for a_row, m_row in zip(adv, mask)]
    assert_close(out.advantages_BT, t(adv, F64))
    assert_close(out.returns_BT, t(ret, F64))


def test_advantage_registry_errors():
    with pytest.raises(ValueError):
        ADVANTAGES["gae"](AdvantageInputs(t([1.0]), torch.tensor([0]), torch.ones(1, 2)))
    with pytest.raises(ValueError):
        register_advantage("grpo")(lambda inp: None)
    with pytest.raises(ValueError):
        register_policy_loss("ppo_clip")(lambda inp, cfg: None)


# ---------------------------------------------------------------- aggregation, KL, value loss

def test_aggregate_hand():
    mask = t([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    loss = t([[1.0, 2.0, 100.0], [4.0, 100.0, 100.0], [100.0, 100.0, float("nan")]])
    assert_close(aggregate(loss, mask, "token_mean"), t(7 / 3))
    assert_close(aggregate(loss, mask, "seq_mean_token_mean"), t((1.5 + 4.0) / 2))  # empty row excluded
    assert_close(aggregate(loss, mask, "seq_mean_token_sum"), t((3.0 + 4.0) / 2))
    assert_close(aggregate(loss, mask, "constant", 2.0), t(7 / (3 * 2.0)))  # B counts every row
    assert_close(masked_mean(loss, mask), t(7 / 3))
    assert_close(masked_mean(loss, mask, dim=-1), t([1.5, 4.0, 0.0]))
    with pytest.raises(ValueError):
        aggregate(loss, mask, "sum")


def ref_agg_coefs(mask, agg, norm):
    """d aggregate / d loss[b][k] for each token (aggregation is linear in the loss)."""
    n_rows = sum(1 for row in mask if sum(row) > 0)
    total = sum(map(sum, mask))
    coef = {"token_mean": lambda row: 1 / total, "constant": lambda row: 1 / (len(mask) * norm),
            "seq_mean_token_mean": lambda row: 1 / (n_rows * sum(row)),
            "seq_mean_token_sum": lambda row: 1 / n_rows}[agg]
    return [[coef(row) * m if m else 0.0 for m in row] for row in mask]


@pytest.mark.parametrize("agg,seed", list(itertools.product(
    ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant"], range(3))))
def test_aggregate_vs_reference(agg, seed):
    rng, _, mask, _ = rand_batch(seed)
    loss = [[rng.uniform(-3, 3) for _ in row] for row in mask]
    coefs = ref_agg_coefs(mask, agg, 3.5)
    ref = sum(c * x for crow, lrow in zip(coefs, loss) for c, x in zip(crow, lrow))
    assert_close(aggregate(t(loss, F64), t(mask, F64), agg, 3.5), t(ref, F64))


def test_kl_hand():
    # p = 0.5, q = 0.25: log p/q = log 2; k3 = q/p - 1 - log(q/p) = 0.5 - 1 + log 2
    logp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    assert_close(kl_estimate(logp, ref, "k1"), t([0.693147]))
    assert_close(kl_estimate(logp, ref, "k2"), t([0.5 * 0.693147**2]))
    assert_close(kl_estimate(logp, ref, "k3"), t([0.193147]))
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k4")


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_vs_reference(kind):
    rng = random.Random(kind)
    lp = [[math.log(rng.uniform(0.01, 1)) for _ in range(6)] for _ in range(4)]
    rf = [[math.log(rng.uniform(0.01, 1)) for _ in range(6)] for _ in range(4)]
    f = {"k1": lambda p, q: p - q, "k2": lambda p, q: 0.5 * (p - q) ** 2,
         "k3": lambda p, q: math.exp(q) / math.exp(p) - 1 - math.log(math.exp(q) / math.exp(p))}[kind]
    ref = [[f(p, q) for p, q in zip(a, b)] for a, b in zip(lp, rf)]
    assert_close(kl_estimate(t(lp, F64), t(rf, F64), kind), t(ref, F64))


def test_value_loss_hand():
    # tokens: V=1.5, V_old=1, R=2: unclipped 0.25, clipped V'=1.2 -> 0.64, max 0.64 (clip active);
    #         V=0.9, V_old=1, R=0: unclipped 0.81, clipped 0.81 (inside the range); masked token ignored
    v = t([[1.5, 0.9, 7.0]]).requires_grad_()
    loss, m = value_loss(v, t([[1.0, 1.0, 0.0]]), t([[2.0, 0.0, 0.0]]), t([[1.0, 1.0, 0.0]]), clip=0.2)
    assert_close(loss, t(0.5 * (0.64 + 0.81) / 2))
    assert m["vf_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert_close(v.grad, t([[0.0, 0.5 * 2 * 0.9 / 2, 0.0]]))
    loss, _ = value_loss(v, t([[1.0, 1.0, 0.0]]), t([[2.0, 0.0, 0.0]]), t([[1.0, 1.0, 0.0]]))
    assert_close(loss, t(0.5 * (0.25 + 0.81) / 2))


# ---------------------------------------------------------------- policy losses: hand cases

def loss_inputs(log_ratio, adv, mask=None, log_w=None, logp=None):
    """logp given (default 0), old = logp - log_ratio, behav = old - log_w."""
    n = len(log_ratio[0])
    logp = t(logp or [[0.0] * n] * len(log_ratio)).requires_grad_()
    old = logp.detach() - t(log_ratio)
    behav = old - t(log_w or [[0.0] * n] * len(log_ratio))
    mask = t(mask or [[1.0] * n] * len(log_ratio))
    return PolicyLossInputs(logp, old, behav, t(adv), mask), logp


def test_ppo_clip_hand_value_and_grad():
    # r = [1, 1.5, 0.5, 1.1, (masked)], A = [1, 1, -1, -2, 5], eps = 0.2:
    #   -min(rA, clip(r)A) = [-1, -1.2 (clipped), 0.8 (clipped), 2.2]; mean = 0.8 / 4 = 0.2
    #   d/dlogp = -r A / 4 on unclipped tokens = [-0.25, 0, 0, 0.55, 0]
    lr = [[0.0, math.log(1.5), math.log(0.5), math.log(1.1), 3.0]]
    inp, logp = loss_inputs(lr, [[1.0, 1.0, -1.0, -2.0, 5.0]], mask=[[1, 1, 1, 1, 0]])
    loss, m, *_ = POLICY_LOSSES["ppo_clip"](inp, loss_cfg(correction="none", trust_region="none"))
    assert_close(loss, t(0.2))
    loss.backward()
    assert_close(logp.grad, t([[-0.25, 0.0, 0.0, 0.55, 0.0]]))
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["is_ess"] == pytest.approx(1.0) and m["mismatch_k1"] == 0.0 and m["is_corrected_frac"] == 0.0


def test_ppo_dual_clip_hand():
    # c = 3: (r=5, A=-1): -min(-5, -1.2) = 5 > 3 -> 3, zero grad; (r=2, A=-1): 2 < 3 stays, grad -rA = 2;
    # (r=5, A=1): -min(5, 1.2) = -1.2, clipped.  mean = (3 + 2 - 1.2) / 3
    inp, logp = loss_inputs([[math.log(5), math.log(2), math.log(5)]], [[-1.0, -1.0, 1.0]])
    loss, m, *_ = POLICY_LOSSES["ppo_clip"](inp, loss_cfg(correction="none", dual_clip=3.0, trust_region="none"))
    assert_close(loss, t(3.8 / 3))
    loss.backward()
    assert_close(logp.grad, t([[0.0, 2 / 3, 0.0]]))
    assert m["clip_frac"] == pytest.approx(2 / 3)


def test_token_corrections_hand():
    # r = 1, A = 1, so loss_t = -w_t; raw w = [1, 3, 0.25, 1.5]
    w = [1.0, 3.0, 0.25, 1.5]
    log_w = [[math.log(x) for x in w]]
    expect = {"tis": ([1.0, 2.0, 0.25, 1.5], 0.25), "mask": ([1.0, 0.0, 0.0, 1.5], 0.5),
              "none": ([1.0, 1.0, 1.0, 1.0], 0.0)}
    for corr, (applied, frac) in expect.items():
        inp, logp = loss_inputs([[0.0] * 4], [[1.0] * 4], log_w=log_w)
        cfg = loss_cfg(correction=corr, is_low=0.5, is_high=2.0, trust_region="none")
        loss, m, *_ = POLICY_LOSSES["ppo_clip"](inp, cfg)
        assert_close(loss, t(-sum(applied) / 4))
        loss.backward()
        assert_close(logp.grad, -t([applied]) / 4)
        assert m["is_corrected_frac"] == pytest.approx(frac)
        assert m["is_weight_mean"] == pytest.approx(5.75 / 4)  # metrics describe the raw w
        assert (m["is_weight_max"], m["is_weight_min"]) == pytest.approx((3.0, 0.25))
        assert m["is_ess"] == pytest.approx(5.75**2 / (4 * (1 + 9 + 0.0625 + 2.25)))
        k1 = -sum(math.log(x) for x in w) / 4  # mean of log mu - log pi_old
        assert m["mismatch_k1"] == pytest.approx(k1, rel=1e-5)
        assert m["mismatch_abs"] == pytest.approx(sum(abs(math.log(x)) for x in w) / 4, rel=1e-5)


def test_sequence_correction_hand():
    # row 0: log w = [log 2, log 8] -> geometric mean 4 -> tis 2; row 1: [log 0.5, (masked) 5] -> 0.5
    log_w = [[math.log(2), math.log(8)], [math.log(0.5), 5.0]]
    inp, _ = loss_inputs([[0.0, 0.0]] * 2, [[1.0, 1.0]] * 2, mask=[[1, 1], [1, 0]], log_w=log_w)
    cfg = loss_cfg(correction="tis", correction_level="sequence", is_high=2.0, agg="seq_mean_token_sum", trust_region="none")
    loss, m, *_ = POLICY_LOSSES["ppo_clip"](inp, cfg)
    assert_close(loss, t(-(2.0 * 2 + 0.5) / 2))
    assert (m["is_weight_mean"], m["is_weight_max"], m["is_corrected_frac"]) == pytest.approx((2.25, 4.0, 0.5))
    cfg = loss_cfg(correction="mask", correction_level="sequence", is_high=2.0, agg="seq_mean_token_sum",
                   trust_region="none")  # is_low 0.5 keeps row 1 (w = 0.5 is inside), drops row 0
    assert_close(POLICY_LOSSES["ppo_clip"](inp, cfg)[0], t(-0.5 / 2))


def test_gspo_hand():
    # row 0: log r = [0.1, 0.3] -> s = exp(0.2) = 1.2214 > 1.2, A = 1: loss -1.2 per token, no grad
    # row 1: log r = [-0.2, (masked), 0.0] -> s = exp(-0.1) = 0.904837: loss -s, grad per token -s / 2 / 2
    inp, logp = loss_inputs([[0.1, 0.0, 0.3], [-0.2, 9.0, 0.0]], [[1.0] * 3] * 2, mask=[[1, 0, 1], [1, 0, 1]])
    loss, m, *_ = POLICY_LOSSES["gspo"](inp, loss_cfg(correction="none", agg="seq_mean_token_mean", trust_region="none"))
    s = math.exp(-0.1)
    assert_close(loss, t((-1.2 - s) / 2))
    loss.backward()
    assert_close(logp.grad, t([[0.0, 0.0, 0.0], [-s / 4, 0.0, -s / 4]]))
    assert m["clip_frac"] == pytest.approx(0.5)


def test_cispo_hand():
    # r = [1.5, 0.5, 1], A = [1, 1, -1], logp = [-1, -2, -0.5]; sg(clip(r)) = [1.2, 0.8, 1]
    # loss = -c A logp = [1.2, 1.6, -0.5], mean 2.3/3; grad = -c A / 3 = [-0.4, -0.8/3, 1/3] (clipped too)
    inp, logp = loss_inputs([[math.log(1.5), math.log(0.5), 0.0]], [[1.0, 1.0, -1.0]], logp=[[-1.0, -2.0, -0.5]])
    loss, m, *_ = POLICY_LOSSES["cispo"](inp, loss_cfg(correction="none", trust_region="none"))
    assert_close(loss, t(2.3 / 3))
    loss.backward()
    assert_close(logp.grad, t([[-0.4, -0.8 / 3, 1 / 3]]))
    assert m["clip_frac"] == pytest.approx(2 / 3)


def trust_case():
    """rho = pi_theta / mu = [0.5, 0.5, 1.5, 1.5, 1, (masked) 50], A = [-1, 1, -1, 1, -1, -1]."""
    rho = [0.5, 0.5, 1.5, 1.5, 1.0, 50.0]
    logp = t([[-1.0] * 6])
    behav = logp - t([[math.log(x) for x in rho]])
    return logp, behav, t([[-1.0, 1.0, -1.0, 1.0, -1.0, -1.0]]), t([[1.0, 1, 1, 1, 1, 0]])


@pytest.mark.parametrize("kind,tau,expected", [
    ("none", 0.04, [1, 1, 1, 1, 1]),
    ("clip", 0.04, [0, 1, 1, 0, 1]),  # A < 0 below 1 - 0.2, A > 0 above 1 + 0.2
    ("neg_clip", 0.04, [0, 1, 1, 1, 1]),  # only the A < 0 side
    # (log rho)^2 = [.4805, .4805, .1644, .1644, 0], mean .258: drop the largest while the rest's mean > tau:
    # rest means .2023, .1096, .0822 -> tau 0.1 drops 3 (ties in position order); tau 0.3 none; tau 0 all but rho=1
    ("m2", 0.1, [0, 0, 0, 1, 1]),
    ("m2", 0.3, [1, 1, 1, 1, 1]),
    ("m2", 0.0, [0, 0, 0, 0, 1]),
])
def test_behaviour_trust_mask_hand(kind, tau, expected):
    logp, behav, adv, mask = trust_case()
    # the math's own edge (tau 0) is below the config's bound, so the settings are a plain namespace
    keep = behaviour_trust_mask(logp, behav, adv, mask, SimpleNamespace(type=kind, eps_low=0.2, eps_high=0.2, tau=tau))
    assert keep[0, :5].tolist() == expected


def test_trust_region_acts_where_the_ppo_ratio_is_one():
    # One optimizer step per batch in decoupled mode: old = logp, so r = 1 and PPO's clip never acts;
    # w = pi_old / mu = rho, truncated at 2 (tis). neg_clip zeroes the A < 0 token with rho = 0.5:
    # loss = -mean(w A) over the 5 tokens with token 0 dropped = -(0.5 - 1.5 + 1.5 - 1) / 5 = 0.1
    logp, behav, adv, mask = trust_case()
    logp.requires_grad_()
    inp = PolicyLossInputs(logp, logp.detach(), behav, adv, mask)
    loss, m, keep, _ = POLICY_LOSSES["ppo_clip"](inp, loss_cfg(trust_region="neg_clip"))
    assert_close(loss, t(0.1))
    assert keep[0, :5].tolist() == [0, 1, 1, 1, 1]  # the decision itself, for the learner's "trust_kept"
    loss.backward()
    assert_close(logp.grad, t([[0.0, -0.5, 1.5, -1.5, 1.0, 0.0]]) / 5)
    assert m["clip_frac"] == 0.0 and m["trust_masked_frac"] == pytest.approx(0.2)
    _, m, *_ = POLICY_LOSSES["ppo_clip"](inp, loss_cfg(trust_region="none"))
    assert m["trust_masked_frac"] == 0.0


def test_entropy_bonus_and_bypass():
    inp, _ = loss_inputs([[0.0, 0.0]], [[1.0, 1.0]])
    inp.behav_logp_BT = inp.old_logp_BT.clone()  # bypass mode: old == mu, so w = 1 exactly
    inp.entropy_BT = t([[0.5, 1.5]])
    loss, m, *_ = POLICY_LOSSES["ppo_clip"](inp, loss_cfg(entropy_coef=0.1))
    assert_close(loss, t(-1.0 - 0.1 * 1.0))
    assert m["entropy"] == pytest.approx(1.0) and m["is_ess"] == pytest.approx(1.0)
    assert m["mismatch_abs"] == 0.0 and m["is_weight_max"] == 1.0
    inp.entropy_BT = None
    with pytest.raises(ValueError):
        POLICY_LOSSES["ppo_clip"](inp, loss_cfg(entropy_coef=0.1))


@pytest.mark.parametrize("kw", [dict(correction="x"), dict(correction={"type": "tis", "level": "batch"}),
                                dict(agg="sum"), dict(dual_clip=1.0), dict(correction={"type": "mask", "low": 1.5}),
                                dict(correction={"type": "tis", "high": 0.9}), dict(clip_low=-0.1),
                                dict(constant_norm=0.0), dict(trust_region={"type": "m2", "tau": 0.0}),
                                dict(trust_region={"type": "clip", "eps_low": 1.5})])
def test_config_validation(kw):
    # The loss settings are checked once, in the config tree, before a loss reads them.
    with pytest.raises(ValueError):
        AlgoConfig(**kw)


def test_the_trust_region_has_bounds_of_its_own():
    # PPO's clip (clip_low / clip_high, on pi_theta / pi_old) and the trust region (on rho = pi_theta / mu)
    # are set apart: here r = 1 everywhere, so only the trust region's eps_low acts. rho = [0.5, 0.5, 1.5,
    # 1.5, 1]: eps_low 0.6 keeps the A < 0 token at rho 0.5 that eps_low 0.2 (and clip_low 0.2) drops.
    logp, behav, adv, mask = trust_case()
    inp = PolicyLossInputs(logp, logp.detach(), behav, adv, mask)
    tight = AlgoConfig(clip_low=0.6, trust_region={"type": "neg_clip", "eps_low": 0.2}, correction="none")
    wide = AlgoConfig(clip_low=0.2, trust_region={"type": "neg_clip", "eps_low": 0.6}, correction="none")
    assert POLICY_LOSSES["ppo_clip"](inp, tight)[1]["trust_masked_frac"] == pytest.approx(0.2)
    assert POLICY_LOSSES["ppo_clip"](inp, wide)[1]["trust_masked_frac"] == 0.0


# ---------------------------------------------------------------- policy losses: loop reference

def ref_policy_loss(name, lp, old, behav, adv, mask, ent, cfg):
    """Pure-python loss, d loss / d logp, and metrics, one token at a time."""
    lo, hi = 1 - cfg.clip_low, 1 + cfg.clip_high
    clip = lambda x, a, b: min(max(x, a), b)  # noqa: E731
    corr = cfg.correction  # typed: none, tis {level, high} or mask {level, low, high}
    seq_level = name == "gspo" or (corr.type != "none" and corr.level == "sequence")
    units, w_tok, corrected = [], [], []  # raw w per unit, applied w per token, corrected per unit
    for b, row in enumerate(mask):
        idx = [k for k, m in enumerate(row) if m]
        raw_row = [math.exp(old[b][k] - behav[b][k]) for k in range(len(row))]
        if seq_level:
            g = math.exp(sum(old[b][k] - behav[b][k] for k in idx) / len(idx)) if idx else 1.0
            raw_row = [g] * len(row)
            units += [g] if idx else []
        else:
            units += [raw_row[k] for k in idx]
        out_of = [(x > corr.high) if corr.type == "tis" else
                  (x < corr.low or x > corr.high) if corr.type == "mask" else False for x in raw_row]
        corrected += [out_of[0]] if seq_level and idx else [out_of[k] for k in idx] if not seq_level else []
        w_tok.append([1.0 if corr.type == "none" else min(x, corr.high) if corr.type == "tis"
                      else (0.0 if o else x) for x, o in zip(raw_row, out_of)])
    keep = ref_trust_keep(name, lp, behav, adv, mask, cfg)
    w_tok = [[w * c for w, c in zip(wr, kr)] for wr, kr in zip(w_tok, keep)]
    coefs = ref_agg_coefs(mask, cfg.agg, cfg.constant_norm)
    loss, grad, clipped, n_tok = 0.0, [[0.0] * len(r) for r in mask], 0, 0
    for b, row in enumerate(mask):
        idx = [k for k, m in enumerate(row) if m]
        s = math.exp(sum(lp[b][k] - old[b][k] for k in idx) / len(idx)) if idx else 1.0
        for k in idx:
            r = s if name == "gspo" else math.exp(lp[b][k] - old[b][k])
            a, w = adv[b][k], w_tok[b][k]
            if name == "cispo":
                c = clip(r, lo, hi)
                l_t, g_t, active = -c * a * lp[b][k], -c * a, c != r
            else:
                l1, l2 = -r * a, -clip(r, lo, hi) * a
                l_t, active = max(l1, l2), l2 > l1
                if cfg.dual_clip is not None and a < 0 and l_t > -cfg.dual_clip * a:
                    l_t, active = -cfg.dual_clip * a, True
                g_t = 0.0 if active else -r * a  # d(-r a)/dlogp_t = -r a (gspo token form: s_i,t = s_i)
            loss += coefs[b][k] * (w * l_t - cfg.entropy_coef * ent[b][k])
            grad[b][k] = coefs[b][k] * w * g_t
            clipped, n_tok = clipped + active, n_tok + 1
    diffs = [behav[b][k] - old[b][k] for b, row in enumerate(mask) for k, m in enumerate(row) if m]
    metrics = {"clip_frac": clipped / n_tok, "is_weight_mean": sum(units) / len(units),
               "is_weight_max": max(units), "is_weight_min": min(units),
               "is_corrected_frac": sum(corrected) / len(units),
               "is_ess": sum(units) ** 2 / (len(units) * sum(u * u for u in units)),
               "mismatch_k1": sum(diffs) / n_tok, "mismatch_abs": sum(map(abs, diffs)) / n_tok,
               "entropy": sum(ent[b][k] for b, row in enumerate(mask) for k, m in enumerate(row) if m) / n_tok,
               "trust_masked_frac": sum(1 - keep[b][k] for b, row in enumerate(mask)
                                        for k, m in enumerate(row) if m) / n_tok}
    return loss, grad, metrics


def rand_loss_batch(seed):
    rng, _, mask, _ = rand_batch(seed)
    garbage = lambda: rng.uniform(20, 40)  # noqa: E731  padding / env positions must not leak
    old = [[-rng.uniform(0, 3) if m else garbage() for m in row] for row in mask]
    lp = [[o + rng.gauss(0, 0.25) if m else garbage() for o, m in zip(ro, row)] for ro, row in zip(old, mask)]
    behav = [[o + rng.gauss(0, 0.6) if m else garbage() for o, m in zip(ro, row)] for ro, row in zip(old, mask)]
    adv = [[rng.gauss(0, 1) if m else garbage() for m in row] for row in mask]
    ent = [[rng.uniform(0, 2) if m else garbage() for m in row] for row in mask]
    return lp, old, behav, adv, mask, ent


LOSS_CASES = list(itertools.product(
    ["ppo_clip", "gspo", "cispo"], ["none", "tis", "mask"], ["token", "sequence"],
    ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant"]))
TRUST = ["none", "clip", "neg_clip", "m2"]


def ref_trust_keep(name, lp, behav, adv, mask, cfg):
    """keep[b][k] of the behaviour trust region, one token at a time (m2: drop the largest while needed)."""
    keep = [[1.0] * len(row) for row in mask]
    toks = [(b, k) for b, row in enumerate(mask) for k, m in enumerate(row) if m]
    log_rho = {(b, k): lp[b][k] - behav[b][k] for b, k in toks}
    region = cfg.trust_region  # typed: none, clip {eps_low, eps_high}, neg_clip {eps_low} or m2 {tau}
    if region.type == "m2":
        ranked = sorted(toks, key=lambda bk: -log_rho[bk] ** 2)  # stable: ties stay in position order
        rest = [log_rho[bk] ** 2 for bk in ranked]
        for i, bk in enumerate(ranked):
            if sum(rest[i:]) / len(rest[i:]) <= region.tau:
                break
            keep[bk[0]][bk[1]] = 0.0
    elif region.type in ("clip", "neg_clip"):
        for b, k in toks:
            rho = math.exp(log_rho[b, k])
            if (adv[b][k] < 0 and rho < 1 - region.eps_low) or (
                    region.type == "clip" and adv[b][k] > 0 and rho > 1 + region.eps_high):
                keep[b][k] = 0.0
    return keep


@pytest.mark.parametrize("name,correction,level,agg", LOSS_CASES)
def test_policy_loss_vs_reference(name, correction, level, agg):
    seed = LOSS_CASES.index((name, correction, level, agg))
    lp, old, behav, adv, mask, ent = rand_loss_batch(seed)
    cfg = loss_cfg(clip_low=0.2, clip_high=0.28 if name != "gspo" else 0.05, correction=correction,
                           correction_level=level, is_low=0.6, is_high=1.5, agg=agg, constant_norm=7.0,
                           dual_clip=3.0 if seed % 2 else None, entropy_coef=0.01 * (seed % 3),
                           trust_region=TRUST[(seed // 2) % 4], m2_tau=0.2)
    logp = t(lp, F64).requires_grad_()
    inp = PolicyLossInputs(logp, t(old, F64), t(behav, F64), t(adv, F64), t(mask, F64), t(ent, F64))
    loss, metrics, *_ = POLICY_LOSSES[name](inp, cfg)
    loss.backward()
    ref_loss, ref_grad, ref_metrics = ref_policy_loss(name, lp, old, behav, adv, mask, ent, cfg)
    assert_close(loss, t(ref_loss, F64))
    assert_close(logp.grad, t(ref_grad, F64))
    assert metrics.keys() == ref_metrics.keys()
    for key, val in ref_metrics.items():
        assert metrics[key] == pytest.approx(val, rel=1e-9, abs=1e-12), key
    assert 0 < metrics["clip_frac"] < 1  # the random data exercises clipping
    if cfg.trust_region.type != "none":
        assert 0 < metrics["trust_masked_frac"] < 1  # ... and the trust region
