"""The no-learning-signal warning (agentrl.telemetry.learning_signal) on hand-built batches, and the end of a run whose
dynamic_filter drops every group (the producer on a scripted pool)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentrl.telemetry.learning_signal import (WHAT_TO_DO, NoLearningSignal, SignalWatch, StepSignal, filter_streak_limit,
                                     step_signal)
from agentrl.types import Episode, Group


def group(gid: int, rewards: list[float], statuses: list[str] | None = None) -> Group:
    eps = []
    for k, r in enumerate(rewards):
        ep = Episode(task_id=f"t{gid}", group_id=gid, reward=r, sample=k,
                     status=(statuses or ["ok"] * len(rewards))[k])
        ep.append([1, 2], generated=False)
        ep.append([3], generated=True, logprobs=[-0.5], versions=[0])
        eps.append(ep)
    return Group(gid, {"id": f"t{gid}"}, eps)


def test_step_signal_counts_groups_with_equal_rewards():
    groups = [group(0, [1, 0, 1, 0]),  # varied
              group(1, [0, 0, 0, 0]),  # equal
              group(2, [0.5, 0.5]),  # equal
              group(3, [1.0, 0.0], ["ok", "env_error"]),  # one trainable episode: no baseline, equal
              group(4, [0.25, 0.75, 0.25])]  # varied
    sig = step_signal(groups, filtered=2)  # dynamic_filter dropped two more for equal rewards
    assert sig == StepSignal(groups=7, equal_groups=5, reward_min=0.0, reward_max=1.0)
    assert sig.equal_frac == pytest.approx(5 / 7)
    assert step_signal([group(0, [2.0, 2.0], ["env_error", "timeout"])]) == StepSignal(0, 0, 0.0, 0.0)


def test_equal_groups_under_a_group_baseline_warn_once_after_the_window():
    watch = SignalWatch("grpo")
    equal = StepSignal(groups=10, equal_groups=10, reward_min=0.0, reward_max=1.0)  # every group all-0 or all-1
    assert [watch.observe(step, equal) for step in range(4)] == [None] * 4
    message = watch.observe(4, equal)
    assert message == ("no learning signal: in the last 5 steps 100% of groups got the same reward for every "
                       "sample, so algo.advantage=grpo gives them all advantage 0 and the policy barely changes. "
                       f"What to do: {WHAT_TO_DO}")
    assert [watch.observe(step, equal) for step in range(5, 12)] == [None] * 7  # once per run
    assert watch.summary() == {"equal_reward_groups_frac": 1.0, "warned_at_step": 4}


def test_the_window_must_be_missing_signal_in_every_step():
    watch = SignalWatch("rloo")
    mostly = StepSignal(groups=10, equal_groups=9, reward_min=0.0, reward_max=1.0)  # 90 %: counts
    some = StepSignal(groups=10, equal_groups=8, reward_min=0.0, reward_max=1.0)  # 80 %: signal
    out = [watch.observe(s, sig) for s, sig in enumerate([mostly] * 4 + [some] + [mostly] * 4)]
    assert out == [None] * 9
    assert watch.observe(9, mostly).startswith("no learning signal: in the last 5 steps 90% of groups")
    assert watch.summary()["equal_reward_groups_frac"] == pytest.approx((9 * 9 + 8) / 100)


def test_a_reward_that_never_varies_warns_whatever_the_estimator():
    for advantage in ("gae", "reinforce_pp", "grpo"):
        watch = SignalWatch(advantage)
        zero = StepSignal(groups=4, equal_groups=4, reward_min=0.0, reward_max=0.0)
        out = [watch.observe(s, zero) for s in range(5)]
        assert out[:4] == [None] * 4
        assert out[4] == ("no learning signal: every episode of the last 5 steps got reward 0: no estimator learns "
                          f"from a reward that never varies. What to do: {WHAT_TO_DO}")


def test_equal_groups_say_nothing_to_an_estimator_without_a_group_baseline():
    watch = SignalWatch("gae")  # the critic's baseline still gives advantages when groups are equal
    equal = StepSignal(groups=10, equal_groups=10, reward_min=0.0, reward_max=1.0)
    assert [watch.observe(s, equal) for s in range(10)] == [None] * 10


class ScriptedPool:
    """Each group's rewards from a script by position (a unit test of the producer alone)."""

    def __init__(self, rewards_at) -> None:
        self.rewards_at = rewards_at

    async def group(self, task, group_id, n, issued_version=0):
        await asyncio.sleep(0)
        return group(group_id, self.rewards_at(group_id))


def test_dynamic_filter_ends_with_no_learning_signal_after_its_limit_of_dropped_groups_in_a_row(caplog):
    """Every group all 0 or all 1: the producer warns once at a quarter of the limit, then `failed` gets
    NoLearningSignal at exactly the limit, and the run's wait for a batch raises it; a kept group resets
    the streak."""
    from agentrl.run.buffer import StalenessBuffer
    from agentrl.rollout.failing import unless_failed
    from agentrl.rollout.pool import Producer

    async def scenario(rewards_at, limit):
        buffer = StalenessBuffer(batch_size=4, group_size=2, max_staleness=1)
        producer = Producer(buffer, ScriptedPool(rewards_at), lambda p: {"id": f"t{p}"}, 2, True, limit)
        task = asyncio.create_task(producer.run())
        try:
            batch = await asyncio.wait_for(unless_failed(buffer.get_batch(0), producer.failed), 10)
            return producer, batch
        except NoLearningSignal as exc:
            return producer, exc
        finally:
            await producer.stop()
            task.cancel()

    with caplog.at_level(logging.WARNING, logger="agentrl"):
        producer, exc = asyncio.run(scenario(lambda p: [float(p % 2)] * 2, 12))
    assert isinstance(exc, NoLearningSignal) and producer.filtered_in_a_row >= 12  # sampling goes on until stopped
    assert str(exc) == ("no learning signal: algo.dynamic_filter dropped the last 12 groups in a row, each for "
                        f"giving every sample the same reward (rewards seen: 0, 1), so no batch could be filled. "
                        f"What to do: {WHAT_TO_DO}")
    warnings = [r.getMessage() for r in caplog.records if "dynamic_filter" in r.getMessage()]
    assert warnings == ["no learning signal: algo.dynamic_filter dropped the last 3 groups in a row, each for giving "
                        "every sample the same reward (rewards seen: 0, 1), so no batch could be filled; sampling "
                        "goes on, and the run ends if 12 in a row are dropped"]

    # Groups 10 and 21 carry a signal: the streaks are 10 and 10, under the limit; the batch fills.
    producer, batch = asyncio.run(scenario(lambda p: [0.0, 1.0] if p in (10, 21) else [0.0, 0.0], 12))
    assert [g.group_id for g in batch.groups] == [10, 21] and producer.groups_filtered >= 20
    assert not producer.failed.done()


def test_filter_streak_limit_is_16_batches_and_at_least_256():
    assert filter_streak_limit(4) == 256 and filter_streak_limit(16) == 256 and filter_streak_limit(64) == 1024
