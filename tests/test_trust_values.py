"""The trust region's per-token decision the learner hands the run viewer (`StepMetrics.token_values`,
"trust_kept"): on the ragged batch of tests/test_packing.py through a real learner (the tiny model, DeepSpeed
ZeRO 0), it is the rule applied to the recorded log pi, mu and advantage, and it is what the step's
`trust_masked_frac` counts. The batch's mu (-2.5..-0.5) sits far above an untrained model's log pi (about
-log V), so rho = pi / mu is far below 1 - eps_low: tokens with A < 0 are dropped, those with A >= 0 kept,
and both kinds occur. Values are 0/1 exactly; the metric is the same count ratio taken in float32
(relative error 2^-24 ≈ 6e-8), compared to 1e-6."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algo import behaviour_trust_mask
from agentrl.config import AlgoConfig
from test_packing import PADDED, build, ragged_batch


def hand_clip(logp: float, mu: float, adv: float, eps_low: float, eps_high: float) -> int:
    """PPO's clip anchored at mu, one token: dropped when rho has left the band the way A pushes."""
    rho = math.exp(logp - mu)
    return int(not ((adv < 0 and rho < 1 - eps_low) or (adv > 0 and rho > 1 + eps_high)))


def stepped(model: str, region: dict, record: bool = True):
    learner = build(model, AlgoConfig(trust_region=region), **PADDED)
    batch = ragged_batch()
    batch.record_values = record
    (m,) = learner.step(batch)
    return learner, batch, m


def test_trust_kept_is_the_clip_rule_on_the_recorded_values(tiny_model):
    learner, batch, m = stepped(tiny_model, {"type": "clip"})
    values, region = m.token_values, learner.algo.trust_region
    kept, logp, adv = values["trust_kept"], values["learner_logprobs"], values["advantages"]
    scored = batch.loss_mask > 0
    for b, t in scored.nonzero().tolist():
        want = hand_clip(float(logp[b, t]), float(batch.behav_logprobs[b, t]), float(adv[b, t]),
                         region.eps_low, region.eps_high)
        assert kept[b, t] == want, (b, t)
    dropped = int((kept[scored] == 0).sum())
    assert 0 < dropped < int(scored.sum())  # the check saw both decisions
    assert m.policy["trust_masked_frac"] == pytest.approx(dropped / int(scored.sum()), abs=1e-6)


@pytest.mark.parametrize("region", [{"type": "m2", "tau": 0.5}, {"type": "clip", "level": "sequence"},
                                    {"type": "neg_clip"}])
def test_trust_kept_follows_the_configured_region(tiny_model, region):
    learner, batch, m = stepped(tiny_model, region)
    values, scored = m.token_values, batch.loss_mask > 0
    want = behaviour_trust_mask(values["learner_logprobs"], batch.behav_logprobs, values["advantages"],
                                batch.loss_mask, learner.algo.trust_region, torch.zeros_like(batch.behav_logprobs))
    assert torch.equal(values["trust_kept"][scored], want[scored])
    dropped = int((values["trust_kept"][scored] == 0).sum())
    assert m.policy["trust_masked_frac"] == pytest.approx(dropped / int(scored.sum()), abs=1e-6)


def test_no_per_token_values_when_the_run_does_not_write_them(tiny_model):
    _, _, m = stepped(tiny_model, {"type": "clip"}, record=False)
    assert m.token_values is None and "trust_masked_frac" in m.policy
