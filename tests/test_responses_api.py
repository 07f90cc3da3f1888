"""The Responses API (`/v1/responses`) and `n` > 1, through the official `openai` client and the Agents
SDK's default model class (OpenAIResponsesModel) on a real aiohttp server on loopback, against a
scripted engine (the model's tool calls are scripted): a Responses conversation with a function
tool builds the same ledger as the chat-completions one, the re-rendered conversation; streamed
events parse with the client's own accumulator; the SDK agent calls its tool, standing alone and as
an AgentEnv episode. tests/test_e2e_responses.py runs the SDK agent on a real vLLM engine."""

from __future__ import annotations

import asyncio
import dataclasses

import agents
import httpx
import openai
import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import RolloutConfig, ServerConfig
from agentrl.env import AgentEnv
from agentrl.rollout.agent_episode import make_server
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.pool import RolloutPool
from agentrl.types import Episode, TrainBatch
from tests.fake_engine import ScriptedEngine
from tests.test_openai_ledger import (CALL, QUESTION, SYSTEM, TOOLS, assert_the_tool_session_ledger, client_for,
                                      served)


TOOL = {"type": "function", "name": "calculator", "description": "Evaluate arithmetic.",
        "parameters": TOOLS[0]["function"]["parameters"]}


def dump(items) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in items]


async def responses_session(tokenizer, stream: bool):
    """tests/test_openai_ledger.py's tool session, as Responses: call, tool output, answer, follow-up."""
    async with served(tokenizer, [CALL, "38893", "Yes."]) as (srv, engine, fmt):
        ep = Episode("t", 0)
        client = client_for(srv.open_session(engine, ep).base_url)
        items: list[dict] = [{"role": "user", "content": QUESTION["content"]}]
        outs = []
        for follow_up in ("tool", "user", None):
            ask = dict(model="m", instructions=SYSTEM["content"], input=items, tools=[TOOL])
            if stream:
                async with client.responses.stream(**ask) as events:
                    kinds = [e.type async for e in events]
                    out = await events.get_final_response()
                assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
            else:
                out = await client.responses.create(**ask)
            outs.append(out)
            items += dump(out.output)
            if follow_up == "tool":
                items.append({"type": "function_call_output", "call_id": out.output[0].call_id, "output": "38893"})
            elif follow_up == "user":
                items.append({"role": "user", "content": "Sure?"})
        return ep, fmt, outs, srv.stats()


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_tool_session_builds_the_chat_sessions_ledger(tiny_tokenizer, stream):
    ep, fmt, outs, stats = asyncio.run(responses_session(tiny_tokenizer, stream))
    call = outs[0].output
    assert [o.type for o in call] == ["function_call"] and call[0].name == "calculator"
    assert call[0].arguments == '{"expression": "437 * 89"}' and call[0].call_id.startswith("call_")
    assert [o.output_text for o in outs] == ["", "38893", "Yes."] and all(o.status == "completed" for o in outs)
    assert outs[1].usage.input_tokens == len(ep.tokens[:ep.turns[1].start])
    assert outs[1].usage.output_tokens == ep.turns[1].n_generated
    assert_the_tool_session_ledger(tiny_tokenizer, stream, ep, fmt, stats)


def test_streamed_events_are_numbered_and_carry_the_text_and_the_call(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["Let me see." + CALL]) as (srv, engine, _):
            client = client_for(f"{srv.url}/v1")
            return [e async for e in await client.responses.create(model="m", input="437 * 89?", tools=[TOOL],
                                                                   stream=True)]
    events = asyncio.run(run())
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and len(deltas) >= 2
    assert kinds[-8:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    done = events[-1].response
    assert "".join(deltas) == done.output[0].content[0].text == "Let me see."
    assert [o.type for o in done.output] == ["message", "function_call"]
    args = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args[0].arguments == done.output[1].arguments == '{"expression": "437 * 89"}' and args[0].output_index == 1


def test_unsupported_responses_fields_are_refused_by_name(tiny_tokenizer):
    cases = {"previous_response_id": {"previous_response_id": "resp_1"},
             "tools[0]": {"tools": [{"type": "web_search"}]},
             "tool_choice": {"tool_choice": "required"},
             "input[0].content[0]": {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
             "input[0].type": {"input": [{"type": "reasoning", "summary": []}]},
             "text.format": {"text": {"format": {"type": "json_object"}}}}

    async def run():
        async with served(tiny_tokenizer, ["a"] * 2) as (srv, engine, _):
            async with httpx.AsyncClient() as http:
                bad = {param: (await http.post(f"{srv.url}/v1/responses", json={"input": "hi", **body})).json()
                       for param, body in cases.items()}
                ok = await http.post(f"{srv.url}/v1/responses", json={
                    "input": "hi", "include": [], "store": False, "metadata": {"k": "v"}, "truncation": "auto",
                    "reasoning": {"effort": "low"}, "parallel_tool_calls": False, "user": "u", "max_output_tokens": 9})
            return bad, ok.json(), engine
    bad, ok, engine = asyncio.run(run())
    assert {param: body["error"]["param"] for param, body in bad.items()} == {p: p for p in cases}
    assert "send the whole conversation" in bad["previous_response_id"]["error"]["message"]
    assert ok["output"][0]["content"][0]["text"] == "a" and ok["metadata"] == {"k": "v"}
    assert engine.calls[0].max_tokens == 9


def test_n_choices_outside_a_session_each_their_own_sample(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, lambda prompt, i: f"sample {i}") as (srv, engine, _):
            client = client_for(f"{srv.url}/v1")
            out = await client.chat.completions.create(model="m", messages=[QUESTION], n=3, seed=5)
            text = await client.completions.create(model="m", prompt="Once", n=2)
            session = client_for(srv.open_session(engine, Episode("t", 0)).base_url)
            with pytest.raises(openai.BadRequestError) as inside:
                await session.chat.completions.create(model="m", messages=[QUESTION], n=3)
            with pytest.raises(openai.BadRequestError) as streamed:
                await client.chat.completions.create(model="m", messages=[QUESTION], n=3, stream=True)
            return out, text, engine, inside.value, streamed.value
    out, text, engine, inside, streamed = asyncio.run(run())
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert sorted(c.message.content for c in out.choices) == ["sample 0", "sample 1", "sample 2"]
    assert sorted(c.seed for c in engine.calls[:3]) == [5, 6, 7] and len({tuple(c.prompt_ids) for c in engine.calls[:3]}) == 1
    prompt = len(engine.calls[0].prompt_ids)
    assert out.usage.prompt_tokens == prompt and out.usage.completion_tokens == sum(
        len(c.output.token_ids) for c in engine.calls[:3])
    assert [c.index for c in text.choices] == [0, 1] and {c.text for c in text.choices} == {"sample 3", "sample 4"}
    assert inside.body["param"] == "n" and "inside a session" in inside.body["message"]
    assert streamed.body["param"] == "n"


# ---------------------------------------------------------------- the Agents SDK's default model class


def calculator(expression: str) -> str:
    """Evaluate arithmetic."""
    return str(eval(expression, {"__builtins__": {}}))  # the test's own fixed expression


def sdk_agent():
    return agents.Agent(name="calc", instructions=SYSTEM["content"], tools=[agents.function_tool(calculator)])


@pytest.mark.parametrize("streamed", [False, True])
def test_the_agents_sdk_default_model_calls_its_tool(tiny_tokenizer, streamed):
    agents.set_tracing_disabled(True)
    agents.set_default_openai_api("responses")

    async def run():
        async with served(tiny_tokenizer, [CALL, "It is 38893."]) as (srv, engine, _):
            agents.set_default_openai_client(client_for(f"{srv.url}/v1"), use_for_tracing=False)
            if streamed:
                result = agents.Runner.run_streamed(sdk_agent(), QUESTION["content"])
                kinds = {e.type async for e in result.stream_events()}
                assert "raw_response_event" in kinds
            else:
                result = await agents.Runner.run(sdk_agent(), QUESTION["content"])
            return result, engine
    result, engine = asyncio.run(run())
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    assert outputs == ["38893"] and result.final_output == "It is 38893."
    assert len(engine.calls) == 2


class SdkAgent(AgentEnv):
    """The Agents SDK's default agent on the episode's client (its default model class: Responses)."""

    async def run(self, client, task):
        from agents.models.openai_provider import OpenAIProvider

        config = agents.RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
        result = await agents.Runner.run(sdk_agent(), task["question"], run_config=config)
        called = any(i.type == "tool_call_output_item" for i in result.new_items)
        return {"reward": float("38893" in result.final_output), "success": called}


async def play_agents(engine, fmt, tasks, agent_cls=None):
    """tests/test_agent_env.py's `play`, with room in a turn for a whole tool call (`agent_cls`: SdkAgent)."""
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=128, temperature=1.0)
    spec = EpisodeSpec(agent_cls or SdkAgent, {}, fmt, cfg, 1024)
    spec = dataclasses.replace(spec, server=make_server(spec, engine, ServerConfig()))
    await spec.server.start()
    try:
        pool = RolloutPool(engine, spec)
        return await asyncio.gather(*(pool.episode(t, i, seed=i) for i, t in enumerate(tasks))), spec.server.stats()
    finally:
        await spec.server.stop()


def sdk_final(tool_reply: str = "38893") -> tuple[list[dict], list[dict]]:
    """The conversation an SDK episode holds, and the chat tools it was rendered with."""
    tool = agents.function_tool(calculator)
    tools = [{"type": "function", "function": {"name": "calculator", "description": tool.description,
                                               "parameters": tool.params_json_schema}}]
    return [SYSTEM, QUESTION, {"role": "assistant", "content": CALL},
            {"role": "tool", "name": "calculator", "content": "38893"},
            {"role": "assistant", "content": tool_reply}], tools


def test_the_agents_sdk_default_agent_trains_through_agentenv(tiny_tokenizer):
    fmt = ChatFormat(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, lambda prompt, i: "38893" if "38893" in tiny_tokenizer.decode(prompt)
                            else CALL)
    tasks = [{"id": f"t{i}", "question": QUESTION["content"]} for i in range(3)]
    episodes, stats = asyncio.run(play_agents(engine, fmt, tasks))
    final, tools = sdk_final()
    tokens, mask = ledger_from_messages(fmt, final, tools)
    for ep in episodes:
        assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True), ep.error
        assert ep.tokens == tokens and ep.loss_mask == mask and not ep.segments
    assert stats["ledger/segments_split"] == 0 and sorted(c.seed for c in engine.calls) == [0, 1, 1000, 1001, 2000, 2001]
    batch = TrainBatch.from_episodes(episodes, None, pad_id=0)
    assert batch.size == 3 and batch.rewards.tolist() == [1.0] * 3 and batch.loss_mask[0].sum() == sum(mask)
