"""Failed episodes: aggregated logs, and the rule that ends a run when failures persist
(agentrl.rollout.failures), played on a real pool with a scripted engine and the fixture env whose
`reset` has a new user's bug (tests/fixtures/flaky_env.py)."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from pathlib import Path

import pytest
from fake_engine import ScriptedEngine

from agentrl.data.chat import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.failures import EpisodesFailing
from agentrl.rollout.pool import RolloutPool

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from flaky_env import FlakyEnv  # noqa: E402

ENV_FILE = str(Path(__file__).parent / "fixtures" / "flaky_env.py")
BUG_LINE = next(i for i, line in enumerate(open(ENV_FILE), 1) if "# the bug" in line)


def tasks(n: int) -> list[dict]:
    return [{"id": f"t-{i}", "low": 1, "high": 15, "target": 11, "history": []} for i in range(n)]


def pool_for(tok, engine, fail_rate: float, **rollout) -> RolloutPool:
    spec = EpisodeSpec(FlakyEnv, {"fail_rate": fail_rate}, ChatFormat(tok), RolloutConfig(**rollout), 512)
    return RolloutPool(engine, spec)


def failure_logs(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agentrl.rollout.failures"]


def test_a_deterministic_bug_ends_the_evaluation_with_the_users_file_and_line(tiny_tokenizer, caplog):
    caplog.set_level(logging.WARNING)

    async def main():
        pool = pool_for(tiny_tokenizer, ScriptedEngine(tiny_tokenizer, lambda p, i: "11"), 1.0,
                        max_concurrency=4, fail_after=8)
        with pytest.raises(EpisodesFailing) as err:
            await pool.evaluate(tasks(1000), seed=0)
        return pool, str(err.value)

    pool, message = asyncio.run(main())
    # 8 in a row trip the watch; the episodes already running when it tripped end too, no new one starts.
    assert 8 <= pool.status_counts["env_error"] <= 8 + 4 and set(pool.status_counts) == {"env_error"}
    assert message.startswith("8 episodes in a row failed with none finishing (rollout.fail_after); "
                              "failed episodes so far: env_error 8 (0 finished).")
    first = f"ended with env_error: TypeError: unhashable type: 'list' (at {ENV_FILE}:{BUG_LINE} in reset)"
    assert f"The first of them, episode eval 0 (task t-0), {first}" in message
    assert f'File "{ENV_FILE}", line {BUG_LINE}, in reset' in message  # the full traceback
    assert 'Its task: {"id": "t-0", "low": 1, "high": 15, "target": 11, "history": []}' in message
    assert "python -m agentrl.check" in message
    # The first failure with its traceback; the others counted in one line when the watch tripped, and
    # one for those that ended while the evaluation was being cancelled.
    logs = failure_logs(caplog)
    assert logs[0].startswith(f"episode eval 0 (task t-0) {first} (first of its kind") and "Traceback" in logs[0]
    assert logs[1].startswith("7 more episodes ended with env_error, e.g. episode eval 1 (task t-1): TypeError")
    rest = pool.status_counts["env_error"] - 8
    assert logs[2:] == ([] if rest == 0 else [
        f"evaluation: {rest} more episode{'s' if rest > 1 else ''} ended with env_error, e.g. {logs[2].split('e.g. ')[1]}"])


def test_transient_failures_are_counted_in_aggregated_lines_and_the_run_goes_on(tiny_tokenizer, caplog):
    caplog.set_level(logging.WARNING)
    random.seed(3)

    async def main():
        pool = pool_for(tiny_tokenizer, ScriptedEngine(tiny_tokenizer, lambda p, i: "11"), 0.3,
                        max_concurrency=4, fail_after=20)
        return pool, await pool.evaluate(tasks(400), seed=0)

    pool, episodes = asyncio.run(main())
    failed = [e for e in episodes if e.status == "env_error"]
    assert len(episodes) == 400 and 0.2 < len(failed) / 400 < 0.4  # ~30 % drawn
    assert all(e.status == "ok" and e.reward == 1.0 for e in episodes if e.status != "env_error")
    assert pool.failures.failed == {"env_error": len(failed)} and pool.failures.finished == 400 - len(failed)
    assert pool.failures.tripped is None
    logs = failure_logs(caplog)
    assert len(logs) == 2, logs
    assert logs[1].startswith(f"evaluation: {len(failed) - 1} more episodes ended with env_error, e.g. episode eval")


def test_one_engine_death_failing_every_episode_in_flight_does_not_end_the_run(tiny_tokenizer):
    # fail_after=4 counts at least max_concurrency + 1 = 17: the 16 episodes in flight fail together.
    def script(prompt_ids, index):
        if index < 16:
            raise RuntimeError("EngineDeadError: the core died")
        return "11"

    async def main():
        pool = pool_for(tiny_tokenizer, ScriptedEngine(tiny_tokenizer, script), 0.0, max_concurrency=16,
                        fail_after=4)
        return pool, await pool.evaluate(tasks(40), seed=0)

    pool, episodes = asyncio.run(main())
    assert pool.failures.limit == 17
    assert [e.status for e in episodes] == ["engine_error"] * 16 + ["ok"] * 24


def test_an_evaluation_where_every_episode_failed_ends_it(tiny_tokenizer):
    async def main():
        pool = pool_for(tiny_tokenizer, ScriptedEngine(tiny_tokenizer, lambda p, i: "11"), 1.0)
        await pool.evaluate(tasks(5), seed=0)

    with pytest.raises(EpisodesFailing, match=r"^all 5 episodes of an evaluation failed; failed episodes so far: "
                                              r"env_error 5 \(0 finished\)"):
        asyncio.run(main())


def test_fail_after_0_never_ends_it(tiny_tokenizer):
    async def main():
        pool = pool_for(tiny_tokenizer, ScriptedEngine(tiny_tokenizer, lambda p, i: "11"), 1.0, fail_after=0)
        await asyncio.gather(*(pool.episode(t, 0, sample=k) for k, t in enumerate(tasks(300))))
        return pool

    pool = asyncio.run(main())
    assert pool.status_counts == {"env_error": 300} and pool.failures.tripped is None
