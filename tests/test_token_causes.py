"""Why each token was or was not trained (`agentrl.algo.correction.TOKEN_CAUSES`): the policy loss's cause code
per token (`PolicyLossOut.cause_BT`, `token_causes`) against hand-applied rules, and the code the learner
records beside each trained episode (`StepMetrics.token_values["cause"]`) on the ragged batch of
tests/test_packing.py through a real learner (the tiny model, DeepSpeed ZeRO 0). The batch's mu (-2.5..-0.5)
sits far above an untrained model's log pi (about -log V), so w = pi_prox / mu and rho = pi / mu are far below
1: a mask correction zeroes every weight, and the clip trust region drops the A < 0 tokens."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algo import POLICY_LOSSES, TOKEN_CAUSES, PolicyLossInputs
from agentrl.config import AlgoConfig
from agentrl.config.algo import ClipTrustRegion, MaskCorrection, NoTrustRegion, TISCorrection
from test_packing import PADDED, build, ragged_batch


def settings(correction, region) -> AlgoConfig:
    """The loss's settings as the learner passes them: the config tree's `algo`."""
    return AlgoConfig(correction=correction.model_dump(), trust_region=region.model_dump())


def hand_cause(logp: float, old: float, mu: float, adv: float, correction, region) -> int:
    """One token by the rules' own words: the trust region on rho = pi / mu by the advantage's side first,
    then the correction on w = pi_old / mu (mask: outside [low, high] -> 0; tis: above high -> high)."""
    rho, w = math.exp(logp - mu), math.exp(old - mu)
    if region.type == "clip":
        if adv < 0 and rho < 1 - region.eps_low:
            return 1
        if adv > 0 and rho > 1 + region.eps_high:
            return 2
    if correction.type == "mask" and not correction.low <= w <= correction.high:
        return 5
    if correction.type == "tis" and w > correction.high:
        return 4
    return 0


@pytest.mark.parametrize("correction, region", [
    (MaskCorrection(type="mask", low=0.8, high=1.25), ClipTrustRegion(type="clip")),
    (TISCorrection(type="tis", high=1.1), ClipTrustRegion(type="clip", eps_low=0.1, eps_high=0.1)),
    (TISCorrection(type="tis", high=1.1), NoTrustRegion(type="none"))])
def test_the_loss_gives_each_token_its_cause(correction, region):
    g = torch.Generator().manual_seed(1)
    mu = -0.5 - 2 * torch.rand(6, 40, generator=g)
    old = mu + 0.6 * (torch.rand(6, 40, generator=g) - 0.5)  # w in about [0.74, 1.35]
    logp = old + 0.6 * (torch.rand(6, 40, generator=g) - 0.5)
    adv = torch.tensor([-1.5, -0.5, 0.0, 0.5, 1.5, 1.0])[:, None].expand(6, 40).clone()
    mask = (torch.rand(6, 40, generator=g) > 0.2).float()
    out = POLICY_LOSSES["ppo_clip"](PolicyLossInputs(logp, old, mu, adv, mask), settings(correction, region))
    assert out.cause_BT.dtype == torch.int8
    want = torch.tensor([[hand_cause(float(logp[b, t]), float(old[b, t]), float(mu[b, t]), float(adv[b, t]),
                                     correction, region) if mask[b, t] else 0 for t in range(40)] for b in range(6)],
                        dtype=torch.int8)
    assert torch.equal(out.cause_BT, want)
    seen = set(want[mask > 0].tolist())
    assert len(seen) >= (2 if region.type == "none" else 3), seen  # the check saw several rules act
    assert torch.equal(out.keep_BT == 0, (want >= 1) & (want <= 3))  # the trust region's masked ones
    assert len(TOKEN_CAUSES) == 8 and TOKEN_CAUSES[0] == "kept"


def test_a_loss_without_causes_is_recorded_by_its_keep_mask():
    from agentrl.algo import PolicyLossOut
    from agentrl.learner.token_record import TokenRecord

    batch = ragged_batch()
    record = TokenRecord(batch)
    keep = torch.ones_like(batch.loss_mask)
    keep[1, :] = 0
    record.decided(slice(0, batch.size), PolicyLossOut(torch.tensor(0.0), {}, keep), batch.loss_mask)
    values = record.values(batch, True)["cause"]
    assert torch.equal(values[1], (batch.loss_mask[1] > 0).to(torch.int8) * 3)
    assert int(values[0].abs().sum()) == 0


def stepped(model: str, **algo):
    learner = build(model, AlgoConfig(**algo), **PADDED)
    batch = ragged_batch()
    batch.record_values = True
    (m,) = learner.step(batch)
    return learner, batch, m


def test_the_learner_records_the_cause_the_loss_gave(tiny_model):
    learner, batch, m = stepped(tiny_model, trust_region={"type": "clip"},
                                correction={"type": "mask", "low": 0.5, "high": 2.0})
    cause, scored = m.token_values["cause"], batch.loss_mask > 0
    adv, logp = m.token_values["advantages"], m.token_values["learner_logprobs"]
    for b, t in scored.nonzero().tolist():
        want = 1 if adv[b, t] < 0 else 5  # rho far below 1 - eps_low; w far below low
        assert cause[b, t] == want, (b, t, float(logp[b, t]), float(batch.behav_logprobs[b, t]))
    assert int(cause[~scored].abs().sum()) == 0
    assert {1, 5} <= set(cause[scored].tolist())
    masked = int((cause[scored] == 1).sum())  # the trust region's count is the step's metric
    assert m.policy["trust_masked_frac"] == pytest.approx(masked / int(scored.sum()), abs=1e-6)


def test_a_frozen_actor_trains_no_token(tiny_model):
    from agentrl.config import LearnerConfig  # noqa: F401  (the key below is LearnerConfig's)

    learner = build(tiny_model, AlgoConfig(), freeze_actor_steps=1, **PADDED)
    batch = ragged_batch()
    batch.record_values = True
    (m,) = learner.step(batch)
    scored = batch.loss_mask > 0
    assert set(m.token_values["cause"][scored].tolist()) == {7} and "trust_kept" not in m.token_values


def test_rows_target_kl_kept_from_training_say_so(tiny_model):
    """Three rows, three optimizer steps, target_kl ~ 0: the step stops after the first; the other rows'
    tokens carry cause 6 (tests/test_learner.py's setup)."""
    from test_learner import _two_step_learner, make_batch

    learner = _two_step_learner(tiny_model, 1e-9, steps=3)
    batch = make_batch(learner, 0.0, rows=3)
    batch.record_values = True
    first, *_ = learner.step(batch)
    cause, scored = first.token_values["cause"], batch.loss_mask > 0
    assert 6 not in cause[0][scored[0]].tolist()
    assert set(cause[1:][scored[1:]].tolist()) == {6}
