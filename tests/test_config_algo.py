"""The `algo` section's typed sub-configs (agentrl.config.algo): each choice holds only its own keys, a key
given where it cannot apply is an error naming the place it belongs, and the old flat keys answer with
their new place, in one line."""

from __future__ import annotations

import pytest

from agentrl.config import AlgoConfig, ConfigError, load_config
from agentrl.config.algo import MOVED_KEYS


def algo(*overrides: str) -> AlgoConfig:
    return load_config(None, list(overrides)).algo


def error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, list(overrides))
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_short_forms_and_full_forms_are_the_same_config():
    assert algo("algo.advantage=gae") == algo("algo.advantage={type: gae}")
    assert algo("algo.correction=mask") == algo("algo.correction={type: mask, level: token, low: 0.5, high: 2}")
    full = algo("algo.kl={type: loss, coef: 0.1, controller: {type: adaptive}}")
    assert full == algo("algo.kl={type: loss, coef: 0.1, controller: adaptive}")
    assert (full.kl.estimator, full.kl.controller.target, full.kl.controller.horizon) == ("k3", 6.0, 10000)
    # an override can dig into a sub-config given in its short form
    a = algo("algo.advantage=gae", "algo.advantage.lam=0.9", "algo.advantage.gamma=0.99")
    assert (a.advantage.type, a.advantage.gamma, a.advantage.lam, a.advantage.value_clip) == ("gae", 0.99, 0.9, 0.2)


def test_no_kl_term_by_default_and_a_kl_term_needs_its_weight():
    assert not algo().has_kl and algo("algo.kl={type: reward, coef: 0.05}").has_kl
    assert "algo.kl.coef: Field required" in error("algo.kl=loss")
    assert "algo.kl.coef: Input should be greater than 0" in error("algo.kl={type: loss, coef: 0}")
    assert error("algo.kl.coef=0.1") == "'algo.kl' needs a type: none | loss | reward; has no type"


@pytest.mark.parametrize("old", sorted(k for k in MOVED_KEYS if k.startswith("algo.")))
def test_every_old_flat_key_names_its_new_place_in_one_line(old):
    msg = error(f"{old}=1")
    assert msg.startswith(f"{old} moved: use algo.")
    with pytest.raises(ValueError, match=f"{old} moved: use"):  # Python callers get the same answer
        AlgoConfig(**{old.removeprefix("algo."): 1})


def test_the_renamed_rollout_key_names_its_new_name():
    assert sorted(k for k in MOVED_KEYS if not k.startswith("algo.")) == ["rollout.tool_parser"]
    assert error("rollout.tool_parser=hermes") == ("rollout.tool_parser moved: use rollout.tool_format (the same names: "
                                                   "hermes, mistral, none, or module:name)")


def test_moved_key_message_as_printed():
    assert error("algo.kl_coef=0.01") == "algo.kl_coef moved: use algo.kl.coef (algo.kl: {type: loss|reward, coef: ...})"
    assert error("algo.gamma=0.99") == "algo.gamma moved: use algo.advantage.gamma (with algo.advantage.type gae)"


# Each case was a start-up warning of agentrl.config.inert (the key had no effect); now it is an error
# that names where the key belongs.
@pytest.mark.parametrize("overrides,message", [
    # was: algo.is_low=0.3 (correction tis) -> "only algo.correction=mask uses a lower bound"
    (["algo.correction={type: tis, low: 0.3}"],
     "config key 'algo.correction.low' belongs to algo.correction type mask, not to type tis"),
    # was: algo.correction=none algo.is_high=3 -> "has no effect with algo.correction=none"
    (["algo.correction={type: none, high: 3}"],
     "config key 'algo.correction.high' belongs to algo.correction type tis / mask, not to type none"),
    (["algo.correction={type: none, level: sequence}"],
     "config key 'algo.correction.level' belongs to algo.correction type tis / mask, not to type none"),
    # was: algo.m2_tau=0.1 (trust_region clip) -> "has no effect: algo.trust_region is clip, not m2"
    (["algo.trust_region={type: clip, tau: 0.1}"],
     "config key 'algo.trust_region.tau' belongs to algo.trust_region type m2, not to type clip"),
    (["algo.trust_region=neg_clip", "algo.trust_region.eps_high=0.3"],
     "config key 'algo.trust_region.eps_high' belongs to algo.trust_region type clip, not to type neg_clip"),
    # was: algo.lam=0.9 (advantage grpo) -> "it belongs to algo.advantage=gae"
    (["algo.advantage={type: grpo, lam: 0.9}"],
     "config key 'algo.advantage.lam' belongs to algo.advantage type gae, not to type grpo"),
    (["algo.advantage=rloo", "algo.advantage.value_clip=0.1"],
     "config key 'algo.advantage.value_clip' belongs to algo.advantage type gae, not to type rloo"),
    # was: algo.kl_estimator=k1 (kl_coef 0) -> "has no effect: algo.kl_coef is 0 (no KL term)"
    (["algo.kl={type: none, estimator: k1}"], "config key 'algo.kl.estimator' belongs to algo.kl type loss, "
                                              "not to type none"),
    (["algo.kl={type: none, coef: 0.1}"], "config key 'algo.kl.coef' belongs to algo.kl type loss / reward, "
                                          "not to type none"),
    # the reward-mode KL term takes k1 of its own: an estimator cannot apply there
    (["algo.kl={type: reward, coef: 0.1, estimator: k3}"],
     "config key 'algo.kl.estimator' belongs to algo.kl type loss, not to type reward"),
    (["algo.kl={type: loss, coef: 0.1, controller: {type: fixed, horizon: 10}}"],
     "config key 'algo.kl.controller.horizon' belongs to algo.kl.controller type adaptive, not to type fixed"),
    (["algo.policy_loss=cispo", "algo.dual_clip=3"],
     "algo.dual_clip applies only with algo.policy_loss ppo_clip or gspo (the clipped surrogate), not cispo"),
])
def test_a_key_where_it_cannot_apply_names_where_it_belongs(overrides, message):
    assert message in error(*overrides)


def test_typos_and_unknown_types_inside_a_sub_config():
    assert "did you mean 'algo.advantage.gamma'?" in error("algo.advantage={type: gae, gama: 0.9}")
    assert "did you mean 'algo.kl.controller.target'?" in error(
        "algo.kl={type: loss, coef: 0.1, controller: {type: adaptive, targt: 3}}")
    assert "'algo.correction' needs a type: none | tis | mask; type 'clip' is not one of them" in error(
        "algo.correction={type: clip, high: 2}")
    assert "algo.correction: Input tag 'clip' found using 'type' does not match any of the expected tags: 'none', " \
           "'tis', 'mask'" in error("algo.correction=clip")
    assert "algo.advantage.type='grpoo' is not one of" in error("algo.advantage=grpoo")
    assert error("algo.advantage=grpoo").endswith("did you mean 'grpo'?")


def test_an_estimator_and_a_loss_a_users_module_registers_are_named_by_module_path():
    # the module registers my_grpo / my_ppo when imported; the config imports it while it checks the names
    mine = "tests.fixtures.custom_algo"
    a = algo(f"algo.advantage={mine}:my_grpo", f"algo.policy_loss={mine}:my_ppo")
    assert (a.advantage.type, a.policy_loss) == (f"{mine}:my_grpo", f"{mine}:my_ppo")
    assert "algo.advantage.type='no_such_pkg.algos:x': cannot import 'no_such_pkg.algos'" in error(
        "algo.advantage=no_such_pkg.algos:x")
    assert "algo.policy_loss='tests.fixtures.custom_algo:nope' is not one of" in error(
        "algo.policy_loss=tests.fixtures.custom_algo:nope")
    assert "after importing 'tests.fixtures.custom_algo' (does it register 'nope'?)" in error(
        "algo.policy_loss=tests.fixtures.custom_algo:nope")
    assert "a name your own module registers goes as 'package.module:name'" in error("algo.policy_loss=my_loss")


def test_values_out_of_bounds_are_located_inside_the_sub_config():
    assert "algo.advantage.lam: Input should be less than or equal to 1" in error("algo.advantage={type: gae, lam: 2}")
    assert "algo.correction.high: Input should be greater than or equal to 1" in error(
        "algo.correction={type: tis, high: 0.5}")


def test_the_trust_region_is_a_choice_with_bounds_of_its_own():
    a = algo("algo.clip_low=0.3", "algo.clip_high=0.28")
    assert a.trust_region.model_dump() == {"type": "clip", "eps_low": 0.2, "eps_high": 0.2}  # not PPO's clip
    assert algo("algo.trust_region=m2").trust_region.tau == 0.04
    assert algo("algo.trust_region={type: neg_clip, eps_low: 0.5}").trust_region.eps_low == 0.5
    assert algo("algo.trust_region=none").trust_region.type == "none"
    assert error("algo.m2_tau=0.1") == "algo.m2_tau moved: use algo.trust_region.tau (with algo.trust_region.type m2)"
    assert "algo.trust_region.tau: Input should be greater than 0" in error("algo.trust_region={type: m2, tau: 0}")


def test_python_callers_get_the_same_answers():
    with pytest.raises(ValueError, match="config key 'algo.advantage.gamma' belongs to algo.advantage type gae, "
                                         "not to type grpo"):
        AlgoConfig(advantage={"type": "grpo", "gamma": 0.9})
    with pytest.raises(ValueError, match="'algo.kl.controller.target' belongs to algo.kl.controller type adaptive"):
        AlgoConfig(kl={"type": "loss", "coef": 0.1, "controller": {"type": "fixed", "target": 3}})
    assert AlgoConfig(advantage="gae", kl={"type": "reward", "coef": 0.1}).has_kl


@pytest.mark.parametrize("overrides", [
    [], ["algo.advantage=gae", "algo.kl={type: loss, coef: 0.1, controller: adaptive}", "algo.correction=mask"],
    ["algo.advantage=rloo", "algo.kl={type: reward, coef: 0.1}", "algo.correction=none",
     "algo.trust_region={type: m2, tau: 0.1}"], ["algo.trust_region={type: neg_clip, eps_low: 0.4}"],
])
def test_a_written_out_config_loads_back(overrides):
    # train's summary.json holds cfg.model_dump(): every key, only the chosen types' keys in a sub-config
    from agentrl.config import build_config

    cfg = load_config(None, overrides)
    assert build_config(cfg.model_dump()) == cfg
