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
    (["algo.dual_clip=3", "algo.clip_low=0.1"], ["algo.dual_clip", "algo.clip_low"]),
    # ...and the trust region, which does act, has bounds of its own: PPO's clip is inert beside any of them
    (["algo.trust_region=neg_clip", "algo.clip_low=0.1", "algo.clip_high=0.3"], ["algo.clip_low", "algo.clip_high"]),
    (["algo.trust_region={type: clip, eps_low: 0.1, eps_high: 0.3}", "algo.clip_high=0.3"], ["algo.clip_high"]),
    # with two mini-batches the ratio moves from 1 on the second: the clips can act, and a clip bound that
    # differs from the (unnamed) trust region's is said to bound PPO's clip only
    (["learner.mini_batches=2", "buffer.max_staleness=2", "algo.dual_clip=3", "algo.clip_low=0.1"], ["algo.clip_low"]),
    (["learner.mini_batches=2", "buffer.max_staleness=2", "algo.dual_clip=3", "algo.clip_low=0.2"], []),
    (["algo.mode=bypass", "algo.clip_high=0.28"], ["algo.clip_high"]),
    (["algo.mode=bypass", "algo.trust_region={type: clip, eps_high: 0.28}", "algo.clip_high=0.28"], ["algo.trust_region"]),
    (["algo.mode=bypass", "algo.correction={type: mask, high: 3}"], ["algo.correction"]),
    (["algo.mode=bypass", "algo.trust_region=clip"], ["algo.trust_region"]),
    (["algo.mode=bypass", "algo.trust_region={type: neg_clip, eps_low: 0.3}"], ["algo.trust_region"]),
    # a trust region tighter than PPO's clip drops tokens the clip would still train on
    (["algo.mode=bypass", "algo.trust_region={type: clip, eps_low: 0.1, eps_high: 0.3}"], []),
    (["algo.mode=bypass", "algo.trust_region={type: clip, eps_low: 0.2, eps_high: 0.1}"], []),
    (["algo.mode=bypass", "algo.trust_region=m2"], []),
    # a version is one optimizer step: a bound below the steps a batch admits no batch of lead
    (["learner.mini_batches=4", "buffer.max_staleness=3"], ["buffer.max_staleness"]),
    (["learner.mini_batches=4", "buffer.max_staleness=4"], []),
    (["learner.mini_batches=4", "buffer.max_staleness=0"], []),
    (["algo.correction={type: mask, low: 0.3}"], []),
    (["algo.trust_region={type: m2, tau: 0.1}"], []),
    # is_low without mask, is_high without a correction, tau without m2, gae keys without gae and KL
    # keys without a KL term were warnings here; now they cannot be written (tests/test_config_algo.py).
    (["learner.lora.rank=4", "learner.lora.dropout=0.1"], ["learner.lora.dropout"]),
])
def test_inert_settings_are_named(overrides, expected):
    assert warned(*overrides) == expected


def test_a_clip_bound_written_for_both_says_it_now_bounds_ppo_s_clip_only():
    """A config from before the trust region had bounds of its own (clip_high set both) is told what to
    write to keep the old numbers."""
    [line] = inert_settings(load_config(None, ["algo.mode=bypass", "algo.clip_high=0.28"]))
    assert line == ("algo.clip_high=0.28 bounds PPO's ratio clip only; the trust region around mu keeps "
                    "algo.trust_region.eps_high=0.2 (a clip_high also set it before the trust region had bounds "
                    "of its own): write algo.trust_region: {type: clip, eps_high: 0.28} to bound both")
