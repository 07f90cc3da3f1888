"""Anthropic's Messages API (`/v1/messages`) through the official `anthropic` client (async, sync, streamed,
the SDK's stream helper), on a real aiohttp server on loopback against a scripted engine (the model's tool
calls are scripted): a Messages conversation with a tool builds exactly the ledger the chat-completions one
does; stop reasons, usage and count_tokens are the ledger's numbers; unsupported fields are refused by name
in the Messages API's error shape; an AgentEnv on `anthropic.AsyncAnthropic` trains like the OpenAI one.
tests/test_e2e_tools.py trains examples/agents/anthropic_agent.yaml on a real vLLM engine."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import anthropic
import httpx
import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.env import AgentEnv
from agentrl.types import Episode, TrainBatch
from tests.fake_engine import ScriptedEngine
from tests.test_responses_api import play_agents
from tests.test_openai_ledger import CALL, QUESTION, SYSTEM, TOOLS, assert_the_tool_session_ledger
from tests.test_openai_ledger import served as openai_served

TOOL = {"name": "calculator", "description": "Evaluate arithmetic.", "input_schema": TOOLS[0]["function"]["parameters"]}


_CLIENTS: list[anthropic.AsyncAnthropic] = []  # closed by `served` before its loop ends


def client_for(session_base_url: str, key: str = "k") -> anthropic.AsyncAnthropic:
    """The SDK appends /v1/messages to its base URL: a session's base is its OpenAI URL without /v1."""
    _CLIENTS.append(anthropic.AsyncAnthropic(base_url=session_base_url.removesuffix("/v1"), api_key=key,
                                             max_retries=0))
    return _CLIENTS[-1]


@asynccontextmanager
async def served(tokenizer, script, **server):
    """tests/test_openai_ledger.py's server, closing the Anthropic clients made against it."""
    async with openai_served(tokenizer, script, **server) as running:
        try:
            yield running
        finally:
            while _CLIENTS:
                await _CLIENTS.pop().close()


def blocks(message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


async def messages_session(tokenizer, stream: bool):
    """tests/test_openai_ledger.py's tool session, as Messages: call, tool result, answer, follow-up."""
    async with served(tokenizer, [CALL, "38893", "Yes."]) as (srv, engine, fmt):
        ep = Episode("t", 0)
        client = client_for(srv.open_session(engine, ep).base_url)
        messages: list[dict] = [{"role": "user", "content": QUESTION["content"]}]
        outs, kinds = [], []
        for follow_up in ("tool", "user", None):
            ask = dict(model="m", max_tokens=100, system=SYSTEM["content"], messages=messages, tools=[TOOL])
            if stream:
                async with client.messages.stream(**ask) as events:
                    kinds.append([e.type async for e in events])
                    out = await events.get_final_message()
            else:
                out = await client.messages.create(**ask)
            outs.append(out)
            messages.append({"role": "assistant", "content": blocks(out)})
            if follow_up == "tool":
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": out.content[0].id, "content": "38893"}]})
            elif follow_up == "user":
                messages.append({"role": "user", "content": [{"type": "text", "text": "Sure?"}]})
        return ep, fmt, outs, kinds, srv.stats()


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_tool_session_builds_the_chat_sessions_ledger(tiny_tokenizer, stream):
    ep, fmt, outs, kinds, stats = asyncio.run(messages_session(tiny_tokenizer, stream))
    call = outs[0].content
    assert [b.type for b in call] == ["tool_use"] and call[0].name == "calculator"
    assert call[0].input == {"expression": "437 * 89"} and outs[0].stop_reason == "tool_use"
    assert [[b.text for b in o.content] for o in outs[1:]] == [["38893"], ["Yes."]]
    assert [o.stop_reason for o in outs[1:]] == ["end_turn", "end_turn"] and all(o.role == "assistant" for o in outs)
    assert outs[1].usage.input_tokens == len(ep.tokens[:ep.turns[1].start])
    assert outs[1].usage.output_tokens == ep.turns[1].n_generated
    assert_the_tool_session_ledger(tiny_tokenizer, stream, ep, fmt, stats)
    if stream:  # the SDK's helper saw the whole event sequence of each message
        assert all(k[0] == "message_start" and k[-2:] == ["message_delta", "message_stop"] for k in kinds)


def test_streamed_events_carry_the_text_and_the_tool_input(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["Let me see." + CALL]) as (srv, engine, _):
            client = client_for(f"{srv.url}/v1")
            return [e async for e in await client.messages.create(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "437 * 89?"}], tools=[TOOL],
                stream=True)]
    events = asyncio.run(run())
    kinds = [e.type for e in events]
    texts = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert kinds[:2] == ["message_start", "content_block_start"] and len(texts) >= 2
    assert kinds[-6:] == ["content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"]
    assert "".join(texts) == "Let me see." and events[1].content_block.type == "text"
    tool_start = events[-5]
    assert (tool_start.index, tool_start.content_block.type, tool_start.content_block.name) == (1, "tool_use",
                                                                                                 "calculator")
    assert events[-4].delta.type == "input_json_delta" and events[-4].delta.partial_json == '{"expression": "437 * 89"}'
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens > 0
    assert events[0].message.usage.input_tokens == events[-2].usage.input_tokens > 0


def test_the_sync_client_and_its_stream_helper(tiny_tokenizer):
    """`anthropic.Anthropic` (blocking, in a thread beside the server's loop): create, then the stream
    helper's text_stream and its accumulated final message with a parsed tool input."""
    async def run():
        async with served(tiny_tokenizer, ["Hello there.", "Sure." + CALL]) as (srv, engine, _):
            def blocking():
                with anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0) as client:
                    one = client.messages.create(model="m", max_tokens=50,
                                                 messages=[{"role": "user", "content": "Hi"}])
                    with client.messages.stream(model="m", max_tokens=100, tools=[TOOL],
                                                messages=[{"role": "user", "content": "437 * 89?"}]) as stream:
                        text = "".join(stream.text_stream)
                        final = stream.get_final_message()
                    return one, text, final
            return await asyncio.to_thread(blocking)
    one, text, final = asyncio.run(run())
    assert one.content[0].text == "Hello there." and one.stop_reason == "end_turn" and one.model == "m"
    assert one.id.startswith("msg_") and one.type == "message"
    assert text == "Sure." and [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"expression": "437 * 89"} and final.stop_reason == "tool_use"


def test_stop_sequences_and_max_tokens_are_the_stop_reasons(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["Hello END more", "a b c d e f g h i j k l m n o p"]) as (srv, engine, _):
            ep = Episode("t", 0)
            client = client_for(srv.open_session(engine, ep).base_url)
            ask = [{"role": "user", "content": "Hi"}]
            stopped = await client.messages.create(model="m", max_tokens=50, messages=ask, stop_sequences=["END"])
            ask += [{"role": "assistant", "content": blocks(stopped)}, {"role": "user", "content": "More"}]
            cut = await client.messages.create(model="m", max_tokens=3, messages=ask)
            return stopped, cut, ep
    stopped, cut, ep = asyncio.run(run())
    assert (stopped.stop_reason, stopped.stop_sequence, stopped.content[0].text) == ("stop_sequence", "END", "Hello ")
    assert (cut.stop_reason, cut.stop_sequence, cut.usage.output_tokens) == ("max_tokens", None, 3)
    assert ep.turns[1].n_generated == 3 and not ep.segments  # the stopped turn was sent back as returned


def test_count_tokens_is_the_prompt_the_model_would_see(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["38893"]) as (srv, engine, _):
            async with httpx.AsyncClient() as http:
                body = {"model": "m", "system": SYSTEM["content"], "tools": [TOOL],
                        "messages": [{"role": "user", "content": QUESTION["content"]}]}
                counted = (await http.post(f"{srv.url}/v1/messages/count_tokens", json=body)).json()
                sdk = await client_for(f"{srv.url}/v1").messages.count_tokens(**body)
                out = await client_for(f"{srv.url}/v1").messages.create(max_tokens=9, **body)
            return counted, sdk, out, engine
    counted, sdk, out, engine = asyncio.run(run())
    assert counted["input_tokens"] == sdk.input_tokens == out.usage.input_tokens == len(engine.calls[0].prompt_ids)
    assert len(engine.calls) == 1  # counting generated nothing


def test_unsupported_fields_are_refused_by_name_in_the_messages_error_shape(tiny_tokenizer):
    hi = [{"role": "user", "content": "hi"}]
    cases = {"top_k": {"top_k": 5},
             "thinking": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
             "tool_choice": {"tool_choice": {"type": "any"}},
             "tool_choice.disable_parallel_tool_use": {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
             "tools.0.type": {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
             "tools.0.input_schema": {"tools": [{"name": "f"}]},
             "messages.0.content.0.type": {"messages": [{"role": "user", "content": [
                 {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
             "messages.0.role": {"messages": [{"role": "tool", "content": "be brief"}]},
             "output_config.format": {"output_config": {"effort": "high", "format": {"type": "json_schema"}}},
             "mcp_servers": {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
             "max_tokens": {"max_tokens": None},
             "temperature": {"temperature": 1.5},
             "stop_sequences": {"stop_sequences": [""]},
             "messages.1": {"messages": hi + [{"role": "assistant", "content": "Partial"}]}}

    async def run():
        async with served(tiny_tokenizer, ["a"] * 2) as (srv, engine, _):
            async with httpx.AsyncClient() as http:
                bad = {}
                for param, body in cases.items():
                    r = await http.post(f"{srv.url}/v1/messages", json={"model": "m", "max_tokens": 9,
                                                                        "messages": hi, **body})
                    bad[param] = (r.status_code, r.json())
                ok = await http.post(f"{srv.url}/v1/messages", json={
                    "model": "m", "max_tokens": 9, "messages": hi, "metadata": {"user_id": "u"},
                    "thinking": {"type": "disabled"}, "tool_choice": {"type": "auto"}, "service_tier": "auto",
                    "output_config": {"effort": "high"},
                    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]})
            with pytest.raises(anthropic.BadRequestError) as sdk:
                await client_for(f"{srv.url}/v1").messages.create(model="m", max_tokens=9, messages=hi,
                                                                  extra_body={"top_k": 5})
            return bad, ok.json(), engine, sdk.value
    bad, ok, engine, sdk = asyncio.run(run())
    for param, (status, body) in bad.items():
        assert status == 400 and body["type"] == "error", (param, body)
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"].startswith(param), body
    assert "continuing a partial assistant turn" in bad["messages.1"][1]["error"]["message"]
    assert ok["content"] == [{"type": "text", "text": "a"}] and engine.calls[0].max_tokens == 9
    assert "messages.0.role: must be 'user', 'assistant' or 'system'" in bad["messages.0.role"][1]["error"]["message"]
    assert sdk.status_code == 400 and sdk.body["error"]["message"].startswith("top_k")


def test_the_api_key_is_read_from_x_api_key_and_errors_keep_the_shape(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["a"], api_key="secret-key") as (srv, engine, _):
            hi = dict(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
            good = await client_for(f"{srv.url}/v1", "secret-key").messages.create(**hi)
            with pytest.raises(anthropic.AuthenticationError) as wrong:
                await client_for(f"{srv.url}/v1", "guess").messages.create(**hi)
            with pytest.raises(anthropic.NotFoundError) as unknown:
                await client_for(f"{srv.url}/sessions/nope/v1", "secret-key").messages.create(**hi)
            return good, wrong.value, unknown.value
    good, wrong, unknown = asyncio.run(run())
    assert good.content[0].text == "a"
    assert wrong.body["error"]["type"] == "authentication_error" and "x-api-key" in wrong.body["error"]["message"]
    assert unknown.body["type"] == "error" and unknown.body["error"]["type"] == "not_found_error"


def test_a_rewritten_conversation_splits_the_ledger_with_its_reason(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["First.", "Second."]) as (srv, engine, _):
            ep = Episode("t", 0)
            client = client_for(srv.open_session(engine, ep).base_url)
            await client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "One"}])
            await client.messages.create(model="m", max_tokens=20, messages=[
                {"role": "user", "content": "One"}, {"role": "assistant", "content": "Edited."},
                {"role": "user", "content": "Two"}])
            return ep, srv.stats()
    ep, stats = asyncio.run(run())
    assert len(ep.segments) == 1 and "message 1 (assistant) differs" in ep.segments[0].reason
    assert stats["ledger/segments_split"] == 1


# ---------------------------------------------------------------- an AgentEnv on anthropic.AsyncAnthropic


class ClaudeStyleAgent(AgentEnv):
    """A tool loop on the Messages API: call the calculator, send its result back, read the answer."""

    api = "anthropic"

    async def run(self, client, task):
        messages = [{"role": "user", "content": task["question"]}]
        for _ in range(3):
            out = await client.messages.create(model="agentrl", max_tokens=128, system=SYSTEM["content"],
                                               messages=messages, tools=[TOOL])
            messages.append({"role": "assistant", "content": blocks(out)})
            calls = [b for b in out.content if b.type == "tool_use"]
            if not calls:
                return {"reward": float("38893" in out.content[0].text), "success": True}
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "38893"}
                                                         for c in calls]})
        return 0.0


def test_an_anthropic_agent_trains_through_agentenv(tiny_tokenizer):
    fmt = ChatFormat(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, lambda prompt, i: "38893" if "38893" in tiny_tokenizer.decode(prompt)
                            else CALL)
    tasks = [{"id": f"t{i}", "question": QUESTION["content"]} for i in range(3)]

    episodes, stats = asyncio.run(play_agents(engine, fmt, tasks, ClaudeStyleAgent))
    final = [SYSTEM, QUESTION, {"role": "assistant", "content": CALL},
             {"role": "tool", "name": "calculator", "content": "38893"}, {"role": "assistant", "content": "38893"}]
    tokens, mask = ledger_from_messages(fmt, final, TOOLS)
    for ep in episodes:
        assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True), ep.error
        assert ep.tokens == tokens and ep.loss_mask == mask and not ep.segments
    assert stats["ledger/segments_split"] == 0 and stats.get("ledger/unauthorized", 0) == 0
    assert sorted(c.seed for c in engine.calls) == [0, 1, 1000, 1001, 2000, 2001]
    batch = TrainBatch.from_episodes(episodes, None, pad_id=0)
    assert batch.size == 3 and batch.rewards.tolist() == [1.0] * 3 and batch.loss_mask[0].sum() == sum(mask)


def test_a_system_message_inside_messages_is_a_system_message_there(tiny_tokenizer):
    """Claude Code sends reminders as `role: "system"` messages inside `messages`: the model reads them as
    the template renders a system message at that point, and the ledger holds exactly that."""
    async def run():
        async with served(tiny_tokenizer, ["Fine."]) as (srv, engine, fmt):
            ep = Episode("t", 0)
            out = await client_for(srv.open_session(engine, ep).base_url).messages.create(
                model="m", max_tokens=20, system="Be brief.", messages=[
                    {"role": "user", "content": "Hi"},
                    {"role": "system", "content": [{"type": "text", "text": "Reminder: answer in one word."}]},
                    {"role": "user", "content": "How are you?"}])
            return out, ep, fmt
    out, ep, fmt = asyncio.run(run())
    final = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "system", "content": "Reminder: answer in one word."}, {"role": "user", "content": "How are you?"},
             {"role": "assistant", "content": "Fine."}]
    tokens, mask = ledger_from_messages(fmt, final)
    assert out.content[0].text == "Fine." and ep.tokens == tokens and ep.loss_mask == mask
