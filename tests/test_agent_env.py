"""AgentEnv: agent code on the real `openai` client, run by the rollout pool through the OpenAI
endpoint (real aiohttp on loopback) against a scripted engine. Rewards come from what `run` returns;
agent and engine failures end only their episode, with the status an Env's would get."""

from __future__ import annotations

import asyncio
import dataclasses

import openai
import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import RolloutConfig, ServerConfig
from agentrl.env import AgentEnv, load_env
from agentrl.rollout.agent_episode import make_server
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.pool import RolloutPool
from tests.fake_engine import ScriptedEngine

QUESTION = {"role": "user", "content": "What is 2 + 3?"}


def say_a(prompt, index):
    return "a"


async def answer_agent(client: openai.AsyncOpenAI, task: dict) -> dict:
    """Two turns: ask, then ask again with the reply and a follow-up; reward 1 if the last reply is the answer."""
    messages = [{"role": "user", "content": task["question"]}]
    out = await client.chat.completions.create(model="agentrl", messages=messages)
    messages += [out.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
    out = await client.chat.completions.create(model="agentrl", messages=messages)
    reply = out.choices[0].message.content
    return {"reward": float(reply == task["answer"]), "success": reply == task["answer"], "tool_success": False}


class CrashingAgent(AgentEnv):
    async def run(self, client, task):
        await client.chat.completions.create(model="agentrl", messages=[QUESTION])
        raise KeyError("the agent's own bug")


class SwallowingAgent(AgentEnv):
    """Catches the engine's error and returns a reward anyway: the episode is still engine_error."""

    async def run(self, client, task):
        try:
            await client.chat.completions.create(model="agentrl", messages=[QUESTION])
        except openai.InternalServerError:
            pass
        return 1.0


class NoneAgent(AgentEnv):
    async def run(self, client, task):
        await client.chat.completions.create(model="agentrl", messages=[QUESTION])


class SlowAgent(AgentEnv):
    async def run(self, client, task):
        await client.chat.completions.create(model="agentrl", messages=[QUESTION])
        await asyncio.sleep(30)
        return 1.0


class ChattyAgent(AgentEnv):
    """Keeps talking until the endpoint refuses: the episode is truncated, not an error."""

    async def run(self, client, task):
        messages = [QUESTION]
        while True:
            out = await client.chat.completions.create(model="agentrl", messages=messages)
            messages += [out.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]


async def play(tokenizer, env_cls, script, tasks, *, episode_timeout_s=60.0, max_turns=4, scored_by_sources=False):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(tokenizer, script)
    cfg = RolloutConfig(max_turns=max_turns, max_tokens_per_turn=32, episode_timeout_s=episode_timeout_s,
                        temperature=1.0)
    spec = EpisodeSpec(env_cls, {}, fmt, cfg, 512, scored_by_sources=scored_by_sources)
    spec = dataclasses.replace(spec, server=make_server(spec, engine, ServerConfig()))
    await spec.server.start()
    try:
        pool = RolloutPool(engine, spec)
        episodes = await asyncio.gather(*(pool.episode(t, i, seed=i) for i, t in enumerate(tasks)))
        return episodes, fmt, spec.server, engine
    finally:
        await spec.server.stop()


def test_a_plain_function_trains_through_agentenv(tiny_tokenizer):
    env_cls = load_env("tests.test_agent_env:answer_agent")
    assert issubclass(env_cls, AgentEnv)

    def script(prompt, index):  # each episode's first reply is its own answer, then "5"
        return "5" if tiny_tokenizer.decode(prompt).count("<|im_start|>assistant") > 1 else "4"

    tasks = [{"id": f"t{i}", "question": f"What is 2 + {i}?", "answer": "5"} for i in range(6)]
    episodes, fmt, server, engine = asyncio.run(play(tiny_tokenizer, env_cls, script, tasks))
    for i, ep in enumerate(episodes):
        assert ep.status == "ok" and ep.reward == 1.0 and ep.success and ep.info["env"]["tool_success"] is False
        final = [{"role": "user", "content": f"What is 2 + {i}?"}, {"role": "assistant", "content": "4"},
                 {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "5"}]
        tokens, mask = ledger_from_messages(fmt, final)
        assert ep.tokens == tokens and ep.loss_mask == mask and ep.messages == final
    assert server.sessions == {} and server.stats()["ledger/sessions"] == 6
    assert sorted(c.seed for c in engine.calls) == sorted(s * 1000 + t for s in range(6) for t in range(2))


def test_agent_failures_end_only_their_episode_with_a_status(tiny_tokenizer):
    def broken(prompt, index):
        raise RuntimeError("EngineDeadError: the core died")

    cases = [
        (CrashingAgent, say_a, {}, "env_error", "KeyError"),
        (SwallowingAgent, broken, {}, "engine_error", "the core died"),
        (NoneAgent, say_a, {}, "env_error", "the agent returned None"),
        (SlowAgent, say_a, {"episode_timeout_s": 0.5}, "timeout", "deadline"),
        (ChattyAgent, say_a, {"max_turns": 3}, "truncated", ""),
    ]
    for env_cls, script, kwargs, status, error in cases:
        (ep,), _, server, _ = asyncio.run(play(tiny_tokenizer, env_cls, script, [{"id": "x"}], **kwargs))
        assert (ep.status, ep.reward) == (status, 0.0), (env_cls.__name__, ep.status, ep.error)
        assert error in ep.error, (env_cls.__name__, ep.error)
        assert server.sessions == {}
    (ep,), *_ = asyncio.run(play(tiny_tokenizer, ChattyAgent, say_a, [{"id": "x"}], max_turns=3))
    assert len(ep.turns) == 3 and ep.trainable


def test_none_is_a_reward_only_when_sources_score_the_episode(tiny_tokenizer):
    (ep,), *_ = asyncio.run(play(tiny_tokenizer, NoneAgent, say_a, [{"id": "x"}], scored_by_sources=True))
    assert ep.status == "ok" and ep.n_generated > 0


@pytest.mark.parametrize("bad", ["x", float("nan"), {"success": True}, True])
def test_a_return_value_that_is_no_reward_is_an_env_error(tiny_tokenizer, bad):
    class Agent(AgentEnv):
        async def run(self, client, task):
            await client.chat.completions.create(model="agentrl", messages=[QUESTION])
            return bad

    (ep,), *_ = asyncio.run(play(tiny_tokenizer, Agent, say_a, [{"id": "x"}]))
    assert ep.status == "env_error" and "the agent returned" in ep.error


def test_the_runs_endpoint_answers_only_the_clients_it_hands_its_agents(tiny_tokenizer):
    """No server.api_key configured: the run's endpoint draws a token of its own. A request without it
    (another program on the machine) is a 401 and reaches no session; the agent's client carries it."""
    import httpx

    seen = {}

    class Prober(AgentEnv):
        async def run(self, client, task):
            async with httpx.AsyncClient() as other:
                body = {"model": "agentrl", "messages": [QUESTION]}
                seen["without"] = (await other.post(f"{client.base_url}chat/completions", json=body)).status_code
                seen["guessed"] = (await other.post(f"{client.base_url}chat/completions", json=body,
                                                    headers={"Authorization": "Bearer agentrl"})).status_code
            seen["key"] = client.api_key
            out = await client.chat.completions.create(model="agentrl", messages=[QUESTION])
            return float(out.choices[0].message.content == "a")

    episodes, _, server, engine = asyncio.run(play(tiny_tokenizer, Prober, say_a, [{"id": "t0"}]))
    assert episodes[0].status == "ok" and episodes[0].reward == 1.0
    assert seen["without"] == 401 and seen["guessed"] == 401 and len(engine.calls) == 1
    assert len(seen["key"]) >= 40 and seen["key"] == server.cfg.api_key.get_secret_value()
    assert ServerConfig().api_key is None  # the user's config is left as it was
