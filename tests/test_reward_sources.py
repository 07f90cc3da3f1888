"""RewardCombiner: weighted sums, per-source stats, retry/drop policy; reward config validation."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrl.config import (ConfigError, EnvSource, HttpSource, RewardModelSource, RewardsConfig, RuleSource,
                            load_config)
from agentrl.types import Episode
from rewards.base import RewardResult
from rewards.sources import RewardCombiner


def episode(reward: float = 1.0, answer: str = "7", reply: str = "7") -> Episode:
    ep = Episode(task_id="t", group_id=0, reward=reward, info={"task": {"answer": answer}})
    ep.messages = [{"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": reply}]
    ep.append([1, 2], generated=False)
    ep.append([3], generated=True, logprobs=[-0.1], versions=[0])
    return ep


def scripted(results: list[RewardResult]):
    calls = []

    async def fn(ep: Episode) -> RewardResult:
        calls.append(ep.task_id)
        return results[min(len(calls) - 1, len(results) - 1)]

    return fn, calls


def combiner(cfg: RewardsConfig, **fns) -> RewardCombiner:
    comb = RewardCombiner(RewardsConfig(sources=[EnvSource(name="env", type="env")]))
    comb.cfg = cfg
    comb.sources = [(EnvSource(name=n, type="env", weight=w), fn) for n, (w, fn) in fns.items()]
    return comb


def test_weighted_sum_of_env_and_rule_sources():
    cfg = RewardsConfig(sources=[EnvSource(name="env", type="env", weight=0.5),
                                 RuleSource(name="rule", type="rule", weight=2.0,
                                            rule="rewards.rules:numeric_match")])
    comb = RewardCombiner(cfg)
    ep = episode(reward=1.0, reply="7")
    asyncio.run(comb.score(ep))
    assert ep.reward == pytest.approx(0.5 * 1.0 + 2.0 * 1.0)
    assert ep.info["rewards"] == {"env": {"value": 1.0, "status": "ok"}, "rule": {"value": 1.0, "status": "ok"}}
    wrong = episode(reward=0.0, reply="8")
    asyncio.run(comb.score(wrong))
    assert wrong.reward == 0.0 and wrong.status == "ok"
    assert comb.metrics()["reward/rule/mean"] == pytest.approx(0.5)
    assert comb.metrics()["reward/rule/ok"] == 2


def test_failed_source_is_retried_then_marks_reward_error_never_zero():
    fn, calls = scripted([RewardResult(math.nan, "timeout", {"error": "deadline"})])
    comb = combiner(RewardsConfig(on_failure="retry", max_retries=2), verifier=(1.0, fn))
    ep = episode(reward=0.3)
    asyncio.run(comb.score(ep))
    assert len(calls) == 3  # first try + 2 retries
    assert ep.status == "reward_error" and "verifier: timeout (deadline)" in ep.error
    assert ep.reward == 0.3  # untouched: the episode is dropped, not scored
    m = comb.metrics()
    assert m["reward/verifier/timeout"] == 3 and m["reward/verifier/retries"] == 2
    assert math.isnan(m["reward/verifier/mean"])


def test_retry_recovers_and_drop_policy_does_not_retry():
    fn, calls = scripted([RewardResult(math.nan, "error", {"error": "500"}), RewardResult(0.25)])
    comb = combiner(RewardsConfig(on_failure="retry", max_retries=1), verifier=(2.0, fn))
    ep = episode()
    asyncio.run(comb.score(ep))
    assert ep.status == "ok" and ep.reward == pytest.approx(0.5) and len(calls) == 2
    fn2, calls2 = scripted([RewardResult(math.nan, "error", {"error": "500"}), RewardResult(0.25)])
    comb2 = combiner(RewardsConfig(on_failure="drop", max_retries=5), verifier=(1.0, fn2))
    ep2 = episode()
    asyncio.run(comb2.score(ep2))
    assert ep2.status == "reward_error" and len(calls2) == 1


def test_non_finite_ok_value_counts_as_error():
    fn, _ = scripted([RewardResult(math.inf)])
    comb = combiner(RewardsConfig(on_failure="drop"), rm=(1.0, fn))
    ep = episode()
    asyncio.run(comb.score(ep))
    assert ep.status == "reward_error" and ep.info["rewards"]["rm"]["error"] == "non-finite reward"


def test_reward_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"rewards\.sources\.0\.http: Field required"):
        load_config(None, ["rewards.sources=[{name: v, type: http}]"])
    with pytest.raises(ConfigError, match=r"rewards\.sources\.0\.http\.url: Field required"):
        load_config(None, ["rewards.sources=[{name: v, type: http, http: {read_timeout_s: 1}}]"])
    with pytest.raises(ConfigError, match="unique"):
        load_config(None, ["rewards.sources=[{name: a, type: env}, {name: a, type: env}]"])
    with pytest.raises(ConfigError, match=r"rewards\.sources\.0\.wieght'; did you mean 'rewards\.sources\.0\.weight'"):
        load_config(None, ["rewards.sources=[{name: a, type: env, wieght: 2}]"])
    cfg = load_config(None, ["rewards.sources=[{name: v, type: http, http: {url: 'http://127.0.0.1:1/verify'}}]"])
    assert cfg.rewards.sources[0].http.url.endswith("/verify")


def test_each_source_type_has_its_own_typed_settings():
    """A typed union on `type`: each source's settings are checked at load, keys named with the nearest valid one."""
    cfg = load_config(None, ["rewards.sources=[{name: e, type: env}, {name: r, type: rule, rule: 'a.b:c'}, "
                             "{name: h, type: http, http: {url: 'http://127.0.0.1:1/v', read_timeout_s: 3}}, "
                             "{name: m, type: reward_model, reward_model: {path: rm, max_batch_size: 8}}]"])
    env, rule, http, rm = cfg.rewards.sources
    assert (type(env), type(rule), type(http), type(rm)) == (EnvSource, RuleSource, HttpSource, RewardModelSource)
    assert (rule.rule, rule.answer_key, http.http.read_timeout_s, http.http.max_retries) == ("a.b:c", "answer", 3.0, 3)
    assert (rm.reward_model.path, rm.reward_model.max_batch_size, rm.reward_model.max_wait_s) == ("rm", 8, 0.01)
    bad = {
        "{name: h, type: http, http: {url: 'http://x/v', read_timeot_s: 3}}":
            "unknown config key 'rewards.sources.0.http.read_timeot_s'; did you mean "
            "'rewards.sources.0.http.read_timeout_s'?",
        "{name: m, type: reward_model, reward_model: {path: rm, max_batch: 8}}":
            "unknown config key 'rewards.sources.0.reward_model.max_batch'; did you mean "
            "'rewards.sources.0.reward_model.max_batch_size'?",
        "{name: r, type: rule, rule: 'a:b', http: {url: 'http://x/v'}}":  # a setting of another type
            "config key 'rewards.sources.0.http' is a setting of reward sources of type http, not of type rule",
        "{name: r, type: rul}": "rewards.sources.0.type='rul' is not one of ['env', 'http', 'prm', 'reward_model', 'rule']; "
                                "did you mean 'rule'?",
        "{name: h, type: http, http: {url: 'ftp://x'}}":
            "invalid config: rewards.sources.0.http.url: url must start with http:// or https://, got 'ftp://x'",
        "{name: m, type: reward_model, reward_model: {path: rm, dtype: float16}}":
            "invalid config: rewards.sources.0.reward_model.dtype: Input should be 'float32' or 'bfloat16'",
    }
    for entry, message in bad.items():
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"rewards.sources=[{entry}]"])
        assert str(err.value) == message
