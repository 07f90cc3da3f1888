"""Start-up warnings for settings that cannot act under the rest of the configuration."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.config.inert import inert_settings


def warned(*overrides: str) -> list[str]:
    """The keys named (as `section.key=`) at the start of each warning."""
    return [s.split("=")[0] for s in inert_settings(load_config(None, list(overrides)))]


def test_defaults_warn_about_nothing():
    assert warned() == []


@pytest.mark.parametrize("overrides,expected", [
    # one optimizer step in decoupled mode: r == 1, so the ratio clips never act...
    (["algo.trust_region=none", "algo.dual_clip=3", "algo.clip_low=0.1", "algo.clip_high=0.3"],
     ["algo.dual_clip", "algo.clip_low", "algo.clip_high"]),
    (["algo.dual_clip=3", "algo.clip_low=0.1"], ["algo.dual_clip"]),  # the default trust region reads clip_low
    # ...unless the trust region reads them (neg_clip reads clip_low only)
    (["algo.trust_region=neg_clip", "algo.clip_low=0.1", "algo.clip_high=0.3"], ["algo.clip_high"]),
    (["algo.trust_region=clip", "algo.clip_low=0.1", "algo.clip_high=0.3"], []),
    # with two mini-batches the ratio moves from 1 on the second: the clips can act
    (["learner.mini_batches=2", "algo.dual_clip=3", "algo.clip_low=0.1"], []),
    (["algo.mode=bypass", "algo.correction=mask", "algo.is_high=3"], ["algo.correction", "algo.is_high"]),
    (["algo.mode=bypass", "algo.trust_region=clip"], ["algo.trust_region"]),
    (["algo.mode=bypass", "algo.trust_region=m2"], []),
    (["algo.is_low=0.3"], ["algo.is_low"]),
    (["algo.correction=mask", "algo.is_low=0.3"], []),
    (["algo.correction=none", "algo.is_high=3"], ["algo.is_high"]),
    (["algo.m2_tau=0.1"], ["algo.m2_tau"]),
    (["algo.trust_region=m2", "algo.m2_tau=0.1"], []),
    (["algo.lam=0.9", "algo.kl_estimator=k1"], ["algo.lam", "algo.kl_estimator"]),
    (["learner.lora.rank=4", "learner.lora.dropout=0.1"], ["learner.lora.dropout"]),
])
def test_inert_settings_are_named(overrides, expected):
    assert warned(*overrides) == expected
