"""The Agents SDK's default agent (its Responses model class) on a real vLLM engine (the warm-started
default model, one engine for the module): standing alone on the server `agentrl.serve` builds, and
as AgentEnv episodes whose ledgers equal the re-rendered conversation and make a training batch; and
`n` = 3 choices, each its own sample. The model is not trained on tools, so whether it calls the
tool is its own choice here; tests/test_responses_api.py scripts the tool calls."""

from __future__ import annotations

import asyncio
import dataclasses

import agents
import openai
import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages, load_tokenizer
from agentrl.config import EngineConfig, RolloutConfig, ServerConfig
from agentrl.rollout.agent_episode import make_server
from agentrl.rollout.engine import Engine
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.pool import RolloutPool
from agentrl.rollout.responses_protocol import chat_tools, input_messages
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import get_tool_format
from agentrl.types import TrainBatch

from agents.models.openai_provider import OpenAIProvider
pytestmark = pytest.mark.e2e

INSTRUCTIONS = "Guess my number from 1 to 100. Reply with a number."


def guess(number: int) -> str:
    """Check a guess."""
    return "higher" if number < 42 else "lower" if number > 42 else "correct"


def agent():
    return agents.Agent(name="guesser", instructions=INSTRUCTIONS, tools=[agents.function_tool(guess)],
                        model_settings=agents.ModelSettings(max_tokens=48))


class GuessAgent:
    async def run(self, client, task):
        config = agents.RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
        result = await agents.Runner.run(agent(), task["question"], run_config=config, max_turns=3)
        task["items"] = result.to_input_list()  # the conversation as the SDK holds it
        return 1.0


def test_the_agents_sdk_default_agent_serves_and_trains_on_a_real_engine(model_dir):
    from agentrl.env import AgentEnv

    fmt = ChatFormat(load_tokenizer(model_dir))
    env_cls = type("GuessAgentEnv", (GuessAgent, AgentEnv), {})

    async def run():
        engine = Engine.start(model_dir, EngineConfig(max_num_seqs=8, max_model_len=512), fmt.eos_id)
        try:
            # Standing alone, as agentrl.serve builds it: requests choose their sampling.
            server = OpenAIServer(fmt, ServerConfig(port=0), get_tool_format("hermes"), Limits(512, 512, 10**6),
                                  engine=engine)
            await server.start()
            try:
                client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
                config = agents.RunConfig(model_provider=OpenAIProvider(openai_client=client),
                                          tracing_disabled=True)
                alone = await agents.Runner.run(agent(), "Guess.", run_config=config, max_turns=3)
                three = await client.chat.completions.create(model="agentrl", n=3, seed=7, max_tokens=16,
                                                             messages=[{"role": "user", "content": INSTRUCTIONS}])
            finally:
                await server.stop()
            cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=48, temperature=1.0)
            spec = EpisodeSpec(env_cls, {}, fmt, cfg, 512)
            spec = dataclasses.replace(spec, server=make_server(spec, engine, ServerConfig(port=0)))
            await spec.server.start()
            tasks = [{"id": f"t{i}", "question": f"Guess number {i}."} for i in range(3)]
            try:
                pool = RolloutPool(engine, spec)
                episodes = await asyncio.gather(*(pool.episode(t, i, seed=i) for i, t in enumerate(tasks)))
            finally:
                await spec.server.stop()
            return alone, three, episodes, tasks
        finally:
            engine.shutdown()

    alone, three, episodes, tasks = asyncio.run(run())
    assert isinstance(alone.final_output, str) and alone.raw_responses
    assert [c.index for c in three.choices] == [0, 1, 2] and three.usage.completion_tokens >= 3
    assert three.usage.prompt_tokens == len(fmt.initial([{"role": "user", "content": INSTRUCTIONS}]))
    tools = chat_tools([{"type": "function", "name": "guess", "description": "Check a guess.",
                         "parameters": agents.function_tool(guess).params_json_schema}])
    for ep, task in zip(episodes, tasks):
        assert ep.status == "ok" and not ep.segments, (ep.status, ep.error, ep.segments)
        final = input_messages({"instructions": INSTRUCTIONS, "input": task["items"]})
        if any(m.get("tool_calls") for m in final):  # rendered as the model wrote them (its own JSON spacing)
            final = ep.messages
        tokens, mask = ledger_from_messages(fmt, final, tools)
        assert ep.tokens == tokens and ep.loss_mask == mask
        assert all(lp <= 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask) if m)
    batch = TrainBatch.from_episodes(episodes, None, pad_id=0)
    assert batch.size == 3 and batch.loss_mask.sum() == sum(sum(ep.loss_mask) for ep in episodes)
