"""The learner's spec: built from the config tree in one place, checked when built (no engine starts)."""

from __future__ import annotations

import dataclasses

import pytest

from agentrl.config import AlgoConfig, LearnerConfig, load_config
from agentrl.learner.spec import LearnerSpec


def test_from_config_reads_each_value_from_its_section(tmp_path):
    cfg = load_config(None, ["buffer.batch_size=12", "rollout.n_samples=4", "rollout.temperature=0.7",
                             "rollout.top_p=0.9", "train.steps=33", "learner.lr=2e-5", "algo.advantage=rloo"])
    spec = LearnerSpec.from_config(cfg, "/models/actor")
    assert (spec.model_path, spec.batch_size, spec.temperature, spec.top_p, spec.total_steps) == (
        "/models/actor", 12, 0.7, 0.9, 33)
    assert spec.learner is cfg.learner and spec.algo is cfg.algo  # the sections themselves, not copies
    assert (spec.critic, spec.critic_path) == (None, None)  # no critic without gae
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.top_p = 1.0


def test_a_gae_learner_gets_its_critic_and_the_folder_it_starts_from(tmp_path):
    folder = tmp_path / "critic"
    folder.mkdir()
    spec = LearnerSpec.from_config(load_config(None, ["algo.advantage=gae"]), "/models/actor")
    assert spec.critic is not None and spec.critic_path == "/models/actor"  # critic.init_from: actor
    cfg = load_config(None, ["algo.advantage=gae", f"critic.init_from={folder}"])
    assert LearnerSpec.from_config(cfg, "/models/actor").critic_path == str(folder)


def test_settings_that_cannot_build_a_learner_fail_when_the_spec_is_made():
    with pytest.raises(ValueError, match="algo.advantage 'gae' needs a critic"):
        LearnerSpec("/m", LearnerConfig(), AlgoConfig(advantage="gae"), 2)
    with pytest.raises(ValueError, match="learner.ema_decay with learner.lora.rank > 0 is not supported"):
        LearnerSpec("/m", LearnerConfig(ema_decay=0.5, lora={"rank": 4}), AlgoConfig(), 2)
