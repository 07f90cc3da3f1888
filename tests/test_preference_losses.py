"""agentrl.algo.preference against numbers computed by hand (the arithmetic is in the comments), and the
sign of the gradients they send to the policy's log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from agentrl.algo import (PREFERENCE_LOSSES, PreferenceLoss, bradley_terry, dpo, ipo, kto, prm_step_scores,
                          prm_token_loss)

F64 = torch.float64


def t(x, grad: bool = False) -> torch.Tensor:
    return torch.tensor(x, dtype=F64, requires_grad=grad)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def softplus(x: float) -> float:  # log(1 + e^x) = -log sigmoid(-x)
    return math.log1p(math.exp(x))


# Two pairs. Pair 0: pc - rc = -1 - (-2) = 1, pr - rr = -3 - (-2) = -1, margin 2 (the policy prefers chosen).
#            Pair 1: pc - rc = -4 - (-3) = -1, pr - rr = -2 - (-3) = 1, margin -2 (it prefers rejected).
PC, PR, RC, RR = [-1.0, -4.0], [-3.0, -2.0], [-2.0, -3.0], [-2.0, -3.0]


def pairs(grad: bool = False):
    return t(PC, grad), t(PR, grad), t(RC), t(RR)


# ---------------------------------------------------------------- DPO

def test_dpo_is_the_bradley_terry_nll_of_the_implicit_rewards():
    # beta 0.5: h = 0.5 * 2 = 1 and 0.5 * -2 = -1; loss = -log sigmoid(h) = log(1 + e^-h)
    out = dpo(*pairs(), beta=0.5)
    assert isinstance(out, PreferenceLoss)
    assert_close(out.losses, t([math.log(1 + math.exp(-1)), math.log(1 + math.exp(1))]))
    assert_close(out.losses, t([0.31326168751822286, 1.3132616875182228]))
    # implicit rewards beta * (logp - ref): chosen 0.5 * [1, -1], rejected 0.5 * [-1, 1]
    assert_close(out.chosen_rewards, t([0.5, -0.5]))
    assert_close(out.rejected_rewards, t([-0.5, 0.5]))


def test_dpo_label_smoothing_is_conservative_dpo():
    # eps 0.1: loss = 0.9 * log(1 + e^-h) + 0.1 * log(1 + e^h), h = [1, -1]
    out = dpo(*pairs(), beta=0.5, label_smoothing=0.1)
    want = [0.9 * softplus(-1) + 0.1 * softplus(1), 0.9 * softplus(1) + 0.1 * softplus(-1)]
    assert_close(out.losses, t(want))
    assert_close(out.losses, t([0.4132616875182228, 1.2132616875182228]))  # 0.3133 + 0.1 * (1.3133 - 0.3133)
    # eps = 0.5 cannot tell chosen from rejected: h = 1 and h = -1 cost the same, 0.5 * (0.3133 + 1.3133)
    assert_close(dpo(*pairs(), beta=0.5, label_smoothing=0.5).losses, t([0.8132616875182228] * 2))
    # the margin stops growing at h* = log((1 - eps) / eps) = log 9: d/dh = -0.9 * sigmoid(-h) + 0.1 * sigmoid(h)
    # = (-0.9 + 0.1 * 9) / 10 = 0 there
    pc = t([math.log(9)], True)
    dpo(pc, t([0.0]), t([0.0]), t([0.0]), beta=1.0, label_smoothing=0.1).losses.sum().backward()
    assert_close(pc.grad, t([0.0]))


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    # d/dpc [-log sigmoid(h)] = -beta * sigmoid(-h): pair 0 -0.5 * sigmoid(-1), pair 1 -0.5 * sigmoid(1)
    pc, pr, rc, rr = pairs(grad=True)
    dpo(pc, pr, rc, rr, beta=0.5).losses.sum().backward()
    assert_close(pc.grad, t([-0.5 * sigmoid(-1), -0.5 * sigmoid(1)]))
    assert_close(pr.grad, -pc.grad)
    assert (pc.grad < 0).all() and (pr.grad > 0).all()
    # with eps 0.1: d/dh = -0.9 * sigmoid(-h) + 0.1 * sigmoid(h); pair 0: -0.9 * 0.2689 + 0.1 * 0.7311 < 0
    pc, pr, rc, rr = pairs(grad=True)
    dpo(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1).losses.sum().backward()
    assert_close(pc.grad, t([0.5 * (-0.9 * sigmoid(-h) + 0.1 * sigmoid(h)) for h in (1, -1)]))
    assert (pc.grad < 0).all()


def test_rewards_are_detached():
    pc, pr, rc, rr = pairs(grad=True)
    for name, loss in PREFERENCE_LOSSES.items():
        out = loss(pc, pr, rc, rr, beta=0.5)
        assert out.losses.requires_grad, name
        assert not out.chosen_rewards.requires_grad and not out.rejected_rewards.requires_grad, name


# ---------------------------------------------------------------- IPO

def test_ipo_regresses_the_margin_onto_one_over_two_beta():
    # beta 0.25: target 1 / (2 * 0.25) = 2; margins [2, -2] -> (2 - 2)^2 = 0 and (-2 - 2)^2 = 16
    pc, pr, rc, rr = pairs(grad=True)
    out = ipo(pc, pr, rc, rr, beta=0.25)
    assert_close(out.losses, t([0.0, 16.0]))
    assert_close(out.chosen_rewards, t([0.25, -0.25]))  # 0.25 * [1, -1]
    # beta 1: target 0.5; margin 2 -> 1.5^2 = 2.25 (unlike DPO's h, the margin is not scaled by beta)
    assert_close(ipo(*pairs(), beta=1.0).losses, t([2.25, 6.25]))  # (-2 - 0.5)^2 = 6.25
    # d/dpc = 2 * (margin - target): pair 0 at the target has zero gradient; pair 1: 2 * (-4) = -8
    out.losses.sum().backward()
    assert_close(pc.grad, t([0.0, -8.0]))
    assert_close(pr.grad, t([0.0, 8.0]))


# ---------------------------------------------------------------- KTO

def test_kto_batch_reference_point():
    # desirable log-ratios [2, 1] (pc - rc), undesirable [0.6] (pr - rr); beta 0.5
    # z = max(0, mean(2, 1, 0.6)) = 3.6 / 3 = 1.2
    # desirable: 1 - sigmoid(0.5 * (2 - 1.2)) = 1 - sigmoid(0.4); 1 - sigmoid(0.5 * (1 - 1.2)) = 1 - sigmoid(-0.1)
    # undesirable: 1 - sigmoid(0.5 * (1.2 - 0.6)) = 1 - sigmoid(0.3)
    pc, pr = t([-1.0, -2.0], True), t([-2.4], True)
    rc, rr = t([-3.0, -3.0]), t([-3.0])
    out = kto(pc, pr, rc, rr, beta=0.5)
    assert_close(out.losses, t([1 - sigmoid(0.4), 1 - sigmoid(-0.1), 1 - sigmoid(0.3)]))
    assert_close(out.losses, t([0.4013123399, 0.5249791875, 0.4255574832]))
    assert_close(out.chosen_rewards, t([1.0, 0.5]))
    assert_close(out.rejected_rewards, t([0.3]))
    # z is detached: the gradients equal those with z = 1.2 passed as a constant.
    # d/dpc [1 - sigmoid(beta (pc - rc - z))] = -beta * s (1 - s), s = sigmoid(0.4) for row 0
    out.losses.sum().backward()
    s0, s2 = sigmoid(0.4), sigmoid(0.3)
    assert_close(pc.grad[0], t(-0.5 * s0 * (1 - s0)))
    assert_close(pr.grad, t([0.5 * s2 * (1 - s2)]))  # lowering an undesirable log-prob lowers the loss
    pc2, pr2 = pc.detach().clone().requires_grad_(), pr.detach().clone().requires_grad_()
    kto(pc2, pr2, rc, rr, beta=0.5, kl=1.2).losses.sum().backward()
    assert_close(pc2.grad, pc.grad)
    assert_close(pr2.grad, pr.grad)


def test_kto_clamps_a_negative_batch_estimate_to_zero():
    # log-ratios: desirable [1, -1], undesirable [-2]; mean -2/3 < 0 -> z = 0
    # 1 - sigmoid(0.5 * 1), 1 - sigmoid(0.5 * -1), 1 - sigmoid(0.5 * (0 + 2)) = 1 - sigmoid(1)
    out = kto(t([-1.0, -4.0]), t([-3.0]), t([-2.0, -3.0]), t([-1.0]), beta=0.5)
    assert_close(out.losses, t([1 - sigmoid(0.5), 1 - sigmoid(-0.5), 1 - sigmoid(1)]))


def test_kto_explicit_kl_and_weights():
    # kl = 0.4 replaces the batch estimate (which would be 1.2); desirable_weight 2, undesirable_weight 1.5
    # desirable: 2 * (1 - sigmoid(0.5 * (2 - 0.4))) = 2 * (1 - sigmoid(0.8)); 2 * (1 - sigmoid(0.3))
    # undesirable: 1.5 * (1 - sigmoid(0.5 * (0.4 - 0.6))) = 1.5 * (1 - sigmoid(-0.1))
    args = t([-1.0, -2.0]), t([-2.4]), t([-3.0, -3.0]), t([-3.0])
    want = t([2 * (1 - sigmoid(0.8)), 2 * (1 - sigmoid(0.3)), 1.5 * (1 - sigmoid(-0.1))])
    for kl in (0.4, torch.tensor(0.4, dtype=F64)):
        out = kto(*args, beta=0.5, kl=kl, desirable_weight=2.0, undesirable_weight=1.5)
        assert_close(out.losses, want)
    # kl = 0 is a given value, not "estimate it"
    out = kto(*args, beta=0.5, kl=0.0)
    assert_close(out.losses[0], t(1 - sigmoid(1.0)))  # 0.5 * (2 - 0)


def test_kto_with_no_desirable_or_no_undesirable_rows():
    empty = t([])
    # only undesirable: log-ratio [-2] -> z = max(0, -2) = 0 -> 1 - sigmoid(0.5 * 2) = 1 - sigmoid(1)
    out = kto(empty, t([-3.0]), empty, t([-1.0]), beta=0.5)
    assert_close(out.losses, t([1 - sigmoid(1)]))
    assert out.chosen_rewards.shape == (0,) and out.rejected_rewards.shape == (1,)
    # only desirable: log-ratios [1, 3] -> z = 2 -> 1 - sigmoid(0.5 * -1), 1 - sigmoid(0.5 * 1)
    pc = t([-1.0, 1.0], True)
    out = kto(pc, empty, t([-2.0, -2.0]), empty, beta=0.5)
    assert_close(out.losses, t([1 - sigmoid(-0.5), 1 - sigmoid(0.5)]))
    out.losses.sum().backward()
    assert (pc.grad < 0).all()  # raising a desirable log-prob lowers the loss
    # nothing at all: no losses, no NaN
    out = kto(empty, empty, empty, empty, beta=0.5)
    assert out.losses.shape == (0,)


# ---------------------------------------------------------------- registry

def test_every_registered_loss_takes_the_union_of_the_settings():
    settings = dict(beta=0.5, label_smoothing=0.0, desirable_weight=1.0, undesirable_weight=1.0, kl=None)
    assert set(PREFERENCE_LOSSES) == {"dpo", "ipo", "kto"}
    for name, loss in PREFERENCE_LOSSES.items():
        out = loss(*pairs(), **settings)
        n = 4 if name == "kto" else 2  # KTO: the two chosen rows, then the two rejected rows
        assert out.losses.shape == (n,) and torch.isfinite(out.losses).all(), name


# ---------------------------------------------------------------- reward models

def test_bradley_terry_per_pair():
    # -log sigmoid(2 - 1) = log(1 + e^-1); -log sigmoid(0 - 1) = log(1 + e)
    r_c, r_r = t([2.0, 0.0], True), t([1.0, 1.0], True)
    losses = bradley_terry(r_c, r_r)
    assert_close(losses, t([softplus(-1), softplus(1)]))
    losses.sum().backward()
    assert_close(r_c.grad, t([-sigmoid(-1), -sigmoid(1)]))  # push the chosen score up
    assert_close(r_r.grad, -r_c.grad)


def test_prm_token_loss_and_scores():
    # R = 2 reward tokens, index 0 = good. Rows: logits [2, 0] label 0; [0, 1] label 1; [1, 1] label 1
    # CE: -log(e^2 / (e^2 + 1)) = log(1 + e^-2); -log(e / (1 + e)) = log(1 + e^-1); -log(1/2) = log 2
    logits = t([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], True)
    labels = torch.tensor([0, 1, 1])
    losses = prm_token_loss(logits, labels)
    assert_close(losses, t([softplus(-2), softplus(-1), math.log(2)]))
    # d CE / d logits = softmax - onehot; row 0: [sigmoid(2) - 1, 1 - sigmoid(2)]
    losses.sum().backward()
    assert_close(logits.grad[0], t([sigmoid(2) - 1, 1 - sigmoid(2)]))
    # P(good) = softmax[:, 0]: sigmoid(2 - 0), sigmoid(0 - 1), 1/2
    assert_close(prm_step_scores(logits.detach()), t([sigmoid(2), sigmoid(-1), 0.5]))
    # R = 3: logits [1, 2, 3] label 2: log(e + e^2 + e^3) - 3; P(good) = e / (e + e^2 + e^3)
    three = t([[1.0, 2.0, 3.0]])
    z = math.e + math.e**2 + math.e**3
    assert_close(prm_token_loss(three, torch.tensor([2])), t([math.log(z) - 3]))
    assert_close(prm_step_scores(three), t([math.e / z]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prm_upcasts_half_precision_logits(dtype):
    logits = torch.tensor([[2.0, 0.0]], dtype=dtype)
    assert prm_step_scores(logits).dtype == torch.float32
    assert prm_token_loss(logits, torch.tensor([0])).dtype == torch.float32
    assert_close(prm_step_scores(logits), torch.tensor([sigmoid(2)], dtype=torch.float32))
