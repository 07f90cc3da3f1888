"""Tool-call formats as one unit: the Mistral format's parser and renderer against hand-written
strings, and the OpenAI endpoint configured with it (a real aiohttp server on loopback, the official
`openai` client, a scripted engine): replies carry the parsed calls with `content` cut at
`[TOOL_CALLS]`, and calls the ledger renders itself are written in Mistral's format, not Hermes'."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import RolloutConfig, ServerConfig
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import TOOL_FORMATS, ToolCall, get_tool_format
from agentrl.types import Episode
from tests.fake_engine import ScriptedEngine
from tests.test_openai_ledger import QUESTION, SYSTEM, TOOLS, client_for

mistral = TOOL_FORMATS["mistral"]
CALL = '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "437 * 89"}}]'


# ---------------------------------------------------------------- parser and renderer


def test_mistral_parses_one_and_parallel_calls_and_string_arguments():
    assert mistral.parse("Let me compute." + CALL) == ([ToolCall("calculator", {"expression": "437 * 89"})], None)
    text = '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": [1, 2]}"}]</s>'
    assert mistral.parse(text) == ([ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2]})], None)
    assert mistral.parse('[TOOL_CALLS][{"name": "now"}]') == ([ToolCall("now", {})], None)
    assert mistral.parse("42, no tools") == ([], None)
    assert mistral.parse('<tool_call>{"name": "a", "arguments": {}}</tool_call>') == ([], None)  # Hermes is text here


@pytest.mark.parametrize("text, calls, error", [
    ('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}', [], "malformed tool call '[{\"name\": \"a\""),  # cut short
    ('[TOOL_CALLS]', [], "malformed tool call ''"),
    ('[TOOL_CALLS]{"name": "a", "arguments": {}}', [], "malformed tool call '{\"name\": \"a\""),  # not a list
    ('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"arguments": {}}]', [ToolCall("a", {})], "malformed tool call"),
    ('[TOOL_CALLS][{"name": "a", "arguments": [1]}]', [], "malformed tool call"),
    ('[TOOL_CALLS]["a"]', [], "malformed tool call '\"a\"'"),
    ('[TOOL_CALLS][{"name": "a", "arguments": "{oops"}]', [], "malformed tool call"),
])
def test_mistral_malformed_input_is_an_error_string_not_an_exception(text, calls, error):
    got_calls, got_error = mistral.parse(text)
    assert got_calls == calls
    assert got_error is not None and got_error.startswith(error)


def test_renderers_write_what_their_parsers_read():
    calls = [ToolCall("calculator", {"expression": "437 * 89"}), ToolCall("now", {})]
    assert mistral.render(calls[:1]) == CALL
    assert mistral.render([]) == ""
    for name in ("hermes", "mistral"):
        fmt = get_tool_format(name)
        text = "Let me see." + fmt.render(calls)
        assert fmt.parse(text) == (calls, None) and fmt.cut(text) == "Let me see."
    assert get_tool_format("hermes").render(calls[:1]) == \
        '<tool_call>{"name": "calculator", "arguments": {"expression": "437 * 89"}}</tool_call>'
    none = get_tool_format("none")
    assert none.parse(CALL) == ([], None) and none.cut(CALL) == CALL and none.start_marker is None
    assert RolloutConfig(tool_format="mistral").tool_format == "mistral"


# ---------------------------------------------------------------- through the endpoint's ledger


@asynccontextmanager
async def served(tokenizer, script, tool_format: str):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(tokenizer, script)
    srv = OpenAIServer(fmt, ServerConfig(), get_tool_format(tool_format), Limits(512, 200, 8), engine=engine)
    await srv.start()
    try:
        yield srv, engine, fmt
    finally:
        await srv.stop()


async def mistral_session(tokenizer, stream: bool):
    """The model calls the calculator in Mistral's format, the agent sends the tool's result back."""
    async with served(tokenizer, ["Let me compute." + CALL, "38893"], "mistral") as (srv, engine, fmt):
        ep = Episode("t", 0)
        client = client_for(srv.open_session(engine, ep).base_url)
        messages, replies = [SYSTEM, QUESTION], []
        for _ in range(2):
            if stream:
                chunks = [c async for c in await client.chat.completions.create(
                    model="m", messages=messages, tools=TOOLS, stream=True)]
                content = "".join(c.choices[0].delta.content or "" for c in chunks)
                calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
                reply = {"role": "assistant", "content": content or None, "finish": chunks[-1].choices[0].finish_reason}
                if calls:
                    reply["tool_calls"] = [{"id": c.id, "type": "function", "function": c.function.model_dump()}
                                           for c in calls]
            else:
                out = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                reply = {**out.choices[0].message.model_dump(exclude_none=True), "finish": out.choices[0].finish_reason}
            replies.append(dict(reply))
            reply.pop("finish")
            messages.append(reply)
            if reply.get("tool_calls"):
                messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "38893"})
        return ep, fmt, replies, srv.stats()


@pytest.mark.parametrize("stream", [False, True])
def test_an_endpoint_configured_with_mistral_parses_and_cuts_its_calls(tiny_tokenizer, stream):
    ep, fmt, replies, stats = asyncio.run(mistral_session(tiny_tokenizer, stream))
    first = replies[0]
    assert first["content"] == "Let me compute." and first["finish"] == "tool_calls"  # cut at [TOOL_CALLS]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in first["tool_calls"]] == \
        [("calculator", {"expression": "437 * 89"})]
    assert replies[1]["content"] == "38893" and replies[1]["finish"] == "stop"
    final = [SYSTEM, QUESTION, {"role": "assistant", "content": "Let me compute." + CALL},
             {"role": "tool", "name": "calculator", "content": "38893"}, {"role": "assistant", "content": "38893"}]
    tokens, mask = ledger_from_messages(fmt, final, TOOLS)
    assert ep.tokens == tokens and ep.loss_mask == mask
    assert ep.info["tool_calls"] == 1 and ep.info["tool_parse_errors"] == 0
    assert not ep.segments and stats["ledger/segments_split"] == 0


async def _resent(tokenizer, tool_format: str):
    """An agent opens a session with a conversation that already holds a tool call (one the model did
    not write in this ledger), so the ledger renders that call itself."""
    async with served(tokenizer, ["38893"], tool_format) as (srv, engine, fmt):
        ep = Episode("t", 0)
        client = client_for(srv.open_session(engine, ep).base_url)
        call = {"id": "call_1", "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "437 * 89"}'}}
        messages = [SYSTEM, QUESTION, {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "38893"}]
        out = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return ep, fmt, out


def test_the_ledger_renders_calls_in_the_configured_format(tiny_tokenizer):
    ep, fmt, out = asyncio.run(_resent(tiny_tokenizer, "mistral"))
    assert out.choices[0].message.content == "38893"
    prompt = [SYSTEM, QUESTION, {"role": "assistant", "content": "Let me compute." + CALL},
              {"role": "tool", "name": "calculator", "content": "38893"}]
    assert ep.tokens[:ep.prompt_len] == fmt.initial(prompt, tools=TOOLS)
    text = fmt.tokenizer.decode(ep.tokens)
    assert CALL in text and "<tool_call>" not in text
    # The same conversation on a Hermes endpoint renders the call as Hermes (unchanged behaviour).
    ep, fmt, _ = asyncio.run(_resent(tiny_tokenizer, "hermes"))
    text = fmt.tokenizer.decode(ep.tokens)
    assert '<tool_call>{"name": "calculator", "arguments": {"expression": "437 * 89"}}</tool_call>' in text
    assert "[TOOL_CALLS]" not in text
