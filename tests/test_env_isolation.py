"""Failures of user Env code and of the engine end only their own episode, with a recorded status;
loading envs by import path; the default tool-call parser.

One Env class misbehaves according to `task["mode"]`, and a scripted fake engine fails when the
prompt asks it to, so every failure kind runs on one pool, concurrently with healthy episodes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from fake_engine import Reply, ScriptedEngine

from agentrl.data.chat import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.env import Action, Env, StepResult, ToolCall, load_env, parse_tool_calls
from agentrl.rollout.episode import EpisodeSpec, run_episode
from agentrl.rollout.pool import RolloutPool
from envs.guess_number import GuessNumberEnv

TURN_TIMEOUT_S = 0.5
GUESSES = ["8", "12", "11"]  # target 11: Higher., Lower., found


class ModeEnv(GuessNumberEnv):
    """GuessNumberEnv that fails on purpose as `task["mode"]` says, and logs its lifecycle."""

    def __init__(self, log: list[tuple[str, str]], max_turns: int = 4) -> None:
        super().__init__(max_turns)
        self.log = log

    async def reset(self, task: dict[str, Any]):
        self.mode, self.task_id = task["mode"], task["id"]
        self.log.append(("reset", self.task_id))
        if self.mode == "reset_raises":
            raise RuntimeError("reset exploded")
        obs = await super().reset(task)
        if self.mode.startswith("engine_"):
            obs[0]["content"] += f" {self.mode.upper()}"  # tells the fake engine to misbehave
        return obs

    async def step(self, action: Action) -> StepResult:
        if self.mode == "step2_raises" and self.turn == 1:
            raise ValueError("step 2 exploded")
        if self.mode == "step_hangs":
            await asyncio.Event().wait()  # forever
        return await super().step(action)

    async def close(self) -> None:
        self.log.append(("close", self.task_id))
        if self.mode == "close_raises":
            raise OSError("close exploded")
        if self.mode == "close_hangs":
            await asyncio.Event().wait()


def policy(tokenizer):
    """Fake engine script: the n-th assistant turn of a prompt guesses GUESSES[n], with fixed
    logprobs/versions so that a healthy episode's ledger does not depend on interleaving."""

    def script(prompt_ids: list[int], index: int) -> Reply:
        text = tokenizer.decode(prompt_ids)
        if "ENGINE_RAISES" in text:
            raise RuntimeError("CUDA out of memory")
        turn = text.count("<|im_start|>assistant") - 1
        return Reply(GUESSES[turn], logprobs=[-0.5, -0.25, -0.125], versions=[turn] * 3)

    return script


class HangingEngine(ScriptedEngine):
    async def generate(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, seed=None):
        if "ENGINE_HANGS" in self.tokenizer.decode(prompt_ids):
            await asyncio.Event().wait()
        return await super().generate(prompt_ids, max_tokens, temperature, top_p, seed)


def make_spec(tok, log, env_cls=ModeEnv, **rollout) -> EpisodeSpec:
    rollout.setdefault("turn_timeout_s", TURN_TIMEOUT_S)
    return EpisodeSpec(env_cls, {"log": log} if env_cls is ModeEnv else {}, ChatFormat(tok),
                       RolloutConfig(**rollout), 512)


def task(mode: str, i: int = 0) -> dict[str, Any]:
    return {"id": f"{mode}-{i}", "low": 1, "high": 15, "target": 11, "mode": mode}


def run(coro, timeout: float = 10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---------------------------------------------------------------- one failure at a time


def line_of(text: str) -> int:
    """The line of this file that holds `text`."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "line_of" not in line)


def test_healthy_episode(tiny_tokenizer):
    log: list = []
    ep = run(run_episode(task("healthy"), HangingEngine(tiny_tokenizer, policy(tiny_tokenizer)),
                         make_spec(tiny_tokenizer, log)))
    assert (ep.status, ep.error, ep.reward, ep.success) == ("ok", "", 1.0, True)
    assert log == [("reset", "healthy-0"), ("close", "healthy-0")]
    assert "close_error" not in ep.info


@pytest.mark.parametrize("mode, status, error, n_generated", [
    ("reset_raises", "env_error", "RuntimeError: reset exploded", 0),
    ("step2_raises", "env_error", "ValueError: step 2 exploded", 4),  # turn 2 was generated, then step failed
    ("step_hangs", "timeout", "episode or turn deadline exceeded", 2),
    ("engine_raises", "engine_error", "RuntimeError: CUDA out of memory", 0),
    ("engine_hangs", "timeout", "episode or turn deadline exceeded", 0),
])
def test_failure_sets_status_and_error(tiny_tokenizer, mode, status, error, n_generated):
    log: list = []
    engine = HangingEngine(tiny_tokenizer, policy(tiny_tokenizer))
    ep = run(run_episode(task(mode), engine, make_spec(tiny_tokenizer, log)))
    assert ep.status == status
    if status == "env_error":  # the user's code raised: its file, line and function are named, with the traceback
        kind, message = error.split(": ", 1)
        raised_at = line_of(f'raise {kind}("{message}")')
        assert ep.error == f"{error} (at {__file__}:{raised_at} in {'reset' if 'reset' in mode else 'step'})"
        assert f'File "{__file__}", line {raised_at}' in ep.traceback
        assert ep.traceback.startswith("Traceback") and ep.traceback.endswith(error)
    else:
        assert (ep.error, ep.traceback) == (error, "")
    assert ep.n_generated == n_generated
    assert ep.reward == 0.0 and not ep.success
    assert not ep.trainable
    assert log == [("reset", task(mode)["id"]), ("close", task(mode)["id"])]  # close() once, also after errors


@pytest.mark.parametrize("mode, close_error", [
    ("close_raises", "OSError('close exploded')"),
    ("close_hangs", "TimeoutError()"),
])
def test_failing_close_is_recorded_and_keeps_the_result(tiny_tokenizer, mode, close_error):
    log: list = []
    ep = run(run_episode(task(mode), HangingEngine(tiny_tokenizer, policy(tiny_tokenizer)),
                         make_spec(tiny_tokenizer, log)))
    assert (ep.status, ep.error, ep.reward, ep.success) == ("ok", "", 1.0, True)
    assert ep.info["close_error"] == close_error
    assert ep.trainable


class InitRaisesEnv(GuessNumberEnv):
    def __init__(self) -> None:
        raise TypeError("bad constructor")


def test_env_constructor_failure_is_env_error(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, GUESSES)
    ep = run(run_episode(task("healthy"), engine, make_spec(tiny_tokenizer, [], env_cls=InitRaisesEnv)))
    raised_at = line_of('raise TypeError("bad constructor")')
    assert (ep.status, ep.error) == ("env_error", f"TypeError: bad constructor (at {__file__}:{raised_at} in __init__)")
    assert engine.calls == []


def test_episode_deadline_covers_the_whole_episode(tiny_tokenizer):
    log: list = []
    ep = run(run_episode(task("step_hangs"), ScriptedEngine(tiny_tokenizer, GUESSES),
                         make_spec(tiny_tokenizer, log, turn_timeout_s=60, episode_timeout_s=0.3)))
    assert (ep.status, ep.error) == ("timeout", "episode or turn deadline exceeded")
    assert log[-1] == ("close", "step_hangs-0")


def test_cancellation_propagates_and_still_closes_the_env(tiny_tokenizer):
    log: list = []
    spec = make_spec(tiny_tokenizer, log, turn_timeout_s=60)

    async def main():
        job = asyncio.create_task(run_episode(task("step_hangs"), ScriptedEngine(tiny_tokenizer, GUESSES), spec))
        while ("reset", "step_hangs-0") not in log:
            await asyncio.sleep(0)
        for _ in range(20):  # let it reach the hanging step
            await asyncio.sleep(0)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    run(main())
    assert log == [("reset", "step_hangs-0"), ("close", "step_hangs-0")]


# ---------------------------------------------------------------- all at once, through the pool


def test_pool_isolates_failures_from_concurrent_healthy_episodes(tiny_tokenizer):
    tok = tiny_tokenizer
    failing = ["reset_raises", "step2_raises", "step_hangs", "close_raises", "close_hangs", "engine_raises",
               "engine_hangs"]

    async def solo():
        return await run_episode(task("healthy"), HangingEngine(tok, policy(tok)), make_spec(tok, []))

    reference = run(solo())

    log: list = []
    engine = HangingEngine(tok, policy(tok))
    spec = make_spec(tok, log, max_concurrency=64)

    async def main():
        pool = RolloutPool(engine, spec)
        jobs = [pool.group(task("healthy", i), 100 + i, 3) for i in range(2)]
        jobs += [pool.group(task(mode), gid, 2) for gid, mode in enumerate(failing)]
        groups = await asyncio.gather(*jobs)
        return pool, groups

    pool, groups = run(main())
    # ok: 2 healthy groups of 3 + close_raises + close_hangs; env_error: reset/step2; timeout: step/engine hangs
    assert pool.status_counts == Counter({"ok": 10, "env_error": 4, "timeout": 4, "engine_error": 2})
    assert pool.in_flight == 0
    by_mode = {g.task["mode"] + str(g.group_id): g for g in groups}
    for i in range(2):
        g = by_mode[f"healthy{100 + i}"]
        assert [e.group_id for e in g.episodes] == [100 + i] * 3
        for ep in g.episodes:
            assert (ep.status, ep.reward, ep.success, ep.error) == ("ok", 1.0, True, "")
            assert (ep.tokens, ep.loss_mask, ep.logprobs, ep.versions) == \
                (reference.tokens, reference.loss_mask, reference.logprobs, reference.versions)
    expected = {"reset_raises": "env_error", "step2_raises": "env_error", "step_hangs": "timeout",
                "close_raises": "ok", "close_hangs": "ok", "engine_raises": "engine_error",
                "engine_hangs": "timeout"}
    for gid, mode in enumerate(failing):
        assert [e.status for e in by_mode[f"{mode}{gid}"].episodes] == [expected[mode]] * 2
    assert pool.generated_tokens == sum(e.n_generated for g in groups for e in g.episodes)
    assert pool.generated_tokens == 6 * 6 + 2 * 4 + 2 * 2 + 2 * 6 + 2 * 6  # healthy, step2, step_hangs, close_*
    closes = Counter(tid for kind, tid in log if kind == "close")
    resets = Counter(tid for kind, tid in log if kind == "reset")
    assert sum(closes.values()) == sum(resets.values()) == 2 * 3 + 2 * len(failing)


class CountingEnv(GuessNumberEnv):
    live = 0
    peak = 0

    async def reset(self, task):
        CountingEnv.live += 1
        CountingEnv.peak = max(CountingEnv.peak, CountingEnv.live)
        return await super().reset(task)

    async def step(self, action):
        await asyncio.sleep(0)
        return await super().step(action)

    async def close(self):
        CountingEnv.live -= 1


def test_pool_respects_max_concurrency(tiny_tokenizer):
    CountingEnv.live = CountingEnv.peak = 0
    spec = make_spec(tiny_tokenizer, [], env_cls=CountingEnv, max_concurrency=2)

    async def main():
        pool = RolloutPool(ScriptedEngine(tiny_tokenizer, policy(tiny_tokenizer)), spec)
        group = await pool.group(task("healthy"), 0, 6)
        return pool, group

    pool, group = run(main())
    assert CountingEnv.peak == 2
    assert pool.status_counts == Counter({"ok": 6})


# ---------------------------------------------------------------- tool calls reach the env


class ToolEnv(Env):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

    def __init__(self) -> None:
        self.actions: list[Action] = []
        ToolEnv.last = self

    async def reset(self, task):
        return [{"role": "system", "content": "use tools"}, {"role": "user", "content": "add 2 and 3"}]

    async def step(self, action: Action) -> StepResult:
        self.actions.append(action)
        if action.tool_parse_error:
            return StepResult([{"role": "tool", "content": action.tool_parse_error}])
        if action.tool_calls:
            return StepResult([{"role": "tool", "content": "5"}])
        return StepResult(None, 1.0 if action.text == "5" else 0.0, True, {"success": action.text == "5"})


def test_tool_calls_are_parsed_and_passed_to_the_env(tiny_tokenizer):
    script = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
              '<tool_call>{"name": "add", </tool_call>',
              "5"]
    engine = ScriptedEngine(tiny_tokenizer, script)
    spec = make_spec(tiny_tokenizer, [], env_cls=ToolEnv, max_tokens_per_turn=128)
    ep = run(run_episode({"id": "tool"}, engine, spec))
    acts = ToolEnv.last.actions
    assert [a.text for a in acts] == script
    assert acts[0].tool_calls == [ToolCall("add", {"a": 2, "b": 3})] and acts[0].tool_parse_error is None
    assert acts[1].tool_calls == [] and acts[1].tool_parse_error.startswith("malformed tool call")
    assert acts[2].tool_calls == [] and acts[2].tool_parse_error is None
    assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True)
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                "assistant"]


# ---------------------------------------------------------------- load_env


def test_load_env_resolves_a_class():
    assert load_env("envs.guess_number:GuessNumberEnv") is GuessNumberEnv


@pytest.mark.parametrize("path, message", [
    ("envs.guess_number.GuessNumberEnv",
     "env import path 'envs.guess_number.GuessNumberEnv' must look like 'package.module:ClassName'"),
    ("envs.no_such_env:Env", "cannot import env module 'envs.no_such_env': No module named 'envs.no_such_env'"),
    ("envs.guess_number:GuessNumbrEnv",
     "module 'envs.guess_number' has no attribute 'GuessNumbrEnv'; classes there: ["),
    ("envs.guess_number:demonstration", "'envs.guess_number:demonstration' is not a subclass of agentrl.env.Env"),
    ("agentrl.env:Action", "'agentrl.env:Action' is not a subclass of agentrl.env.Env"),
])
def test_load_env_errors_say_what_is_wrong(path, message):
    with pytest.raises(ValueError) as err:
        load_env(path)
    assert str(err.value).startswith(message)


def test_load_env_missing_attribute_lists_the_classes_there():
    with pytest.raises(ValueError) as err:
        load_env("envs.guess_number:GuessNumbrEnv")
    assert "'GuessNumberEnv'" in str(err.value)


# ---------------------------------------------------------------- parse_tool_calls


def test_parse_single_tool_call():
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "x", "k": 3}}\n</tool_call>'
    calls, error = parse_tool_calls(text)
    assert calls == [ToolCall("search", {"q": "x", "k": 3})]
    assert error is None


def test_parse_parallel_tool_calls_in_order():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {"y": [1, 2]}}</tool_call>')
    assert parse_tool_calls(text) == ([ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2]})], None)


def test_parse_no_tool_call_and_missing_arguments():
    assert parse_tool_calls("just 42") == ([], None)
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == ([ToolCall("now", {})], None)


@pytest.mark.parametrize("text, fragment", [
    ('<tool_call>{"name": "a", </tool_call>', "malformed tool call '{\"name\": \"a\",'"),
    ('<tool_call>{"arguments": {}}</tool_call>', ": 'name'"),
    ('<tool_call>["a"]</tool_call>', "malformed tool call '[\"a\"]'"),
    ('<tool_call>{"name": "a", "arguments": 5}</tool_call>', "malformed tool call"),
])
def test_parse_malformed_tool_call_returns_error(text, fragment):
    calls, error = parse_tool_calls(text)
    assert calls == []
    assert error.startswith("malformed tool call")
    assert fragment in error


def test_parse_keeps_calls_before_a_malformed_one():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>not json</tool_call>'
    calls, error = parse_tool_calls(text)
    assert calls == [ToolCall("a", {})]
    assert error.startswith("malformed tool call 'not json'")
