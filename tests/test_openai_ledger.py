"""The OpenAI endpoint's token ledger, through the real `openai` client and a real aiohttp server on
loopback, against a scripted in-memory engine: the ledger equals the template's rendering of the final
conversation, rewritten history splits it (and is counted), streaming and non-streaming agree, and
the wire format (tool calls, stop, errors, auth) is OpenAI's."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import httpx
import openai
import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import ServerConfig
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import get_tool_format
from agentrl.types import Episode, TrainBatch
from tests.fake_engine import Reply, ScriptedEngine

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "437 * 89"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
SYSTEM = {"role": "system", "content": "Tools: calculator."}
QUESTION = {"role": "user", "content": "What is 437 * 89?"}


@asynccontextmanager
async def served(tokenizer, script, limits: Limits | None = None, **server):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(tokenizer, script)
    srv = OpenAIServer(fmt, ServerConfig(**server), get_tool_format("hermes"), limits or Limits(512, 200, 8),
                       engine=engine)
    await srv.start()
    try:
        yield srv, engine, fmt
    finally:
        await srv.stop()


def client_for(url: str, key: str = "k") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)


def assert_the_tool_session_ledger(tokenizer, stream: bool, ep, fmt, stats) -> None:
    """`ep` (a tool session held through another API) is exactly the chat-completions tool session's
    ledger (`tool_session`), the template's rendering of the conversation, with no split."""
    chat = asyncio.run(tool_session(tokenizer, stream))[0]
    final = [SYSTEM, QUESTION, {"role": "assistant", "content": CALL},
             {"role": "tool", "name": "calculator", "content": "38893"}, {"role": "assistant", "content": "38893"},
             {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}]
    tokens, mask = ledger_from_messages(fmt, final, TOOLS)
    assert ep.tokens == chat.tokens == tokens and ep.loss_mask == chat.loss_mask == mask
    assert ep.logprobs == chat.logprobs and ep.info["tool_calls"] == 1
    assert not ep.segments and stats["ledger/segments_split"] == 0


async def tool_session(tokenizer, stream: bool):
    """A tool-calling agent loop: call, tool result, answer; then a user follow-up and a second answer."""
    async with served(tokenizer, [CALL, "38893", "Yes."]) as (srv, engine, fmt):
        ep = Episode("t", 0)
        client = client_for(srv.open_session(engine, ep).base_url)
        messages = [SYSTEM, QUESTION]
        contents = []
        for follow_up in ("tool", "user", None):
            if stream:
                chunks = [c async for c in await client.chat.completions.create(
                    model="m", messages=messages, tools=TOOLS, stream=True)]
                content = "".join(c.choices[0].delta.content or "" for c in chunks)
                calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
                finish = chunks[-1].choices[0].finish_reason
                reply = {"role": "assistant", "content": content or None}
                if calls:
                    reply["tool_calls"] = [{"id": c.id, "type": "function", "function": c.function.model_dump()}
                                           for c in calls]
            else:
                out = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                reply = out.choices[0].message.model_dump(exclude_none=True)
                finish = out.choices[0].finish_reason
            contents.append((reply.get("content"), finish))
            messages.append(reply)
            if follow_up == "tool":
                messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "38893"})
            elif follow_up == "user":
                messages.append({"role": "user", "content": "Sure?"})
        return ep, engine, fmt, contents, srv.stats()


@pytest.mark.parametrize("stream", [False, True])
def test_tool_session_ledger_equals_the_template_rendering(tiny_tokenizer, stream):
    ep, engine, fmt, contents, stats = asyncio.run(tool_session(tiny_tokenizer, stream))
    assert contents == [(None, "tool_calls"), ("38893", "stop"), ("Yes.", "stop")]
    final = [SYSTEM, QUESTION, {"role": "assistant", "content": CALL},
             {"role": "tool", "name": "calculator", "content": "38893"}, {"role": "assistant", "content": "38893"},
             {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}]
    tokens, mask = ledger_from_messages(fmt, final, TOOLS)
    assert ep.tokens == tokens and ep.loss_mask == mask
    whole = fmt.encode(fmt.render(final, generation_prompt=False, tools=TOOLS))
    assert whole[:len(tokens)] == tokens and fmt.tokenizer.decode(whole[len(tokens):]) == fmt.after_eos
    # Each request's prompt was the ledger so far; generated tokens keep the engine's logprobs and versions.
    for call, turn in zip(engine.calls, ep.turns):
        assert ep.tokens[:turn.start] == call.prompt_ids
        n = turn.n_generated
        assert ep.logprobs[turn.start:turn.start + n] == call.output.logprobs
        assert ep.versions[turn.start:turn.start + n] == call.output.versions
    assert ep.info["tool_calls"] == 1 and not ep.segments and stats["ledger/segments_split"] == 0


def test_streaming_and_not_give_the_same_ledger(tiny_tokenizer):
    plain = asyncio.run(tool_session(tiny_tokenizer, False))[0]
    streamed = asyncio.run(tool_session(tiny_tokenizer, True))[0]
    for key in ("tokens", "loss_mask", "logprobs", "versions", "prompt_len"):
        assert getattr(plain, key) == getattr(streamed, key), key


async def _rewrite(tokenizer):
    async with served(tokenizer, ["No idea.", "38893", "Yes."]) as (srv, engine, fmt):
        ep = Episode("t", 0)
        client = client_for(srv.open_session(engine, ep).base_url)
        first = [QUESTION]
        out = await client.chat.completions.create(model="m", messages=first)
        # The agent rewrites its own prompt (a summariser, a retry with a better instruction).
        rewritten = [SYSTEM, {"role": "user", "content": "What is 437 * 89? Think."}]
        out2 = await client.chat.completions.create(model="m", messages=rewritten)
        follow = rewritten + [out2.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
        await client.chat.completions.create(model="m", messages=follow)
        return ep, fmt, srv.stats(), out


def test_rewritten_history_starts_a_second_segment(tiny_tokenizer):
    ep, fmt, stats, _ = asyncio.run(_rewrite(tiny_tokenizer))
    assert stats["ledger/segments_split"] == 1 and len(ep.segments) == 1
    assert ep.segments[0].reason == "message 0 (system) differs from the conversation the ledger holds"
    first, _ = ledger_from_messages(fmt, [QUESTION, {"role": "assistant", "content": "No idea."}])
    assert ep.segments[0].tokens == first
    second, mask = ledger_from_messages(fmt, [SYSTEM, {"role": "user", "content": "What is 437 * 89? Think."},
                                              {"role": "assistant", "content": "38893"},
                                              {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}])
    assert ep.tokens == second and ep.loss_mask == mask and ep.prompt_len == len(fmt.initial(ep.messages[:2]))
    # Both segments are trained, each a row carrying the episode's reward and group.
    ep.reward = 0.5
    batch = TrainBatch.from_episodes([ep, Episode("u", 1, tokens=[5, 6], loss_mask=[0, 1], logprobs=[0, -1],
                                                    versions=[-1, 0], reward=1.0)], torch_adv := None, pad_id=0)
    assert torch_adv is None
    assert batch.size == 3 and batch.rewards.tolist() == [0.5, 0.5, 1.0] and batch.group_ids.tolist() == [0, 0, 1]
    assert batch.input_ids[0, :len(first)].tolist() == first and batch.loss_mask[1].sum() == sum(mask)
    assert ep.n_generated == sum(ep.segments[0].loss_mask) + sum(mask)


def test_dropped_reply_and_fabricated_assistant_messages_split(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["a", "b", "c"]) as (srv, engine, _):
            ep = Episode("t", 0)
            client = client_for(srv.open_session(engine, ep).base_url)
            await client.chat.completions.create(model="m", messages=[QUESTION])
            await client.chat.completions.create(model="m", messages=[QUESTION])  # the reply was dropped
            await client.chat.completions.create(model="m", messages=[
                QUESTION, {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "made up"},
                {"role": "user", "content": "?"}])
            return ep
    ep = asyncio.run(run())
    reasons = [s.reason for s in ep.segments]
    assert len(reasons) == 2 and "dropped messages" in reasons[0] and "did not write" in reasons[1]


def test_stop_strings_cut_the_text_and_the_ledger_keeps_what_was_sampled(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["42 and then more text", "ok"]) as (srv, engine, fmt):
            ep = Episode("t", 0)
            client = client_for(srv.open_session(engine, ep).base_url)
            out = await client.chat.completions.create(model="m", messages=[QUESTION], stop=[" and"])
            msg = out.choices[0].message
            await client.chat.completions.create(model="m", messages=[
                QUESTION, {"role": "assistant", "content": msg.content}, {"role": "user", "content": "?"}])
            return ep, fmt, out
    ep, fmt, out = asyncio.run(run())
    assert out.choices[0].message.content == "42" and out.choices[0].finish_reason == "stop"
    turn = ep.turns[0]
    kept = ep.tokens[turn.start:turn.start + turn.n_generated]
    assert fmt.tokenizer.decode(kept).startswith("42 and") and fmt.tokenizer.decode(kept[:-1]).find(" and") < 0
    # The cut turn is closed with EOS before the next message, as rollout closes a turn cut at max_tokens.
    assert ep.tokens[turn.start + turn.n_generated] == fmt.eos_id and not ep.segments


def test_training_sessions_keep_the_runs_sampling_and_count_overrides(tiny_tokenizer):
    async def run():
        limits = Limits(512, 6, 2, temperature=0.7, top_p=0.9)
        async with served(tiny_tokenizer, [Reply("a b c d e f g h", eos=False), "x"], limits) as (srv, engine, _):
            ep = Episode("t", 0)
            session = srv.open_session(engine, ep)
            session.seed = 3
            client = client_for(session.base_url)
            out = await client.chat.completions.create(model="m", messages=[QUESTION], temperature=1.3,
                                                       max_tokens=100)
            msgs = [QUESTION, {"role": "assistant", "content": out.choices[0].message.content},
                    {"role": "user", "content": "?"}]
            await client.chat.completions.create(model="m", messages=msgs, seed=11)
            with pytest.raises(openai.BadRequestError) as err:  # max_turns = 2
                await client.chat.completions.create(model="m", messages=msgs + [{"role": "assistant", "content": "x"},
                                                                                 {"role": "user", "content": "?"}])
            return engine, srv.stats(), session, out, err.value
    engine, stats, session, out, err = asyncio.run(run())
    first, second = engine.calls
    assert (first.temperature, first.top_p, first.max_tokens, first.seed) == (0.7, 0.9, 6, 3000)
    assert second.seed == 11 and stats["ledger/sampling_overridden"] == 1 and stats["ledger/max_tokens_capped"] == 1
    assert out.choices[0].finish_reason == "length" and session.truncated
    assert err.status_code == 400 and err.body["code"] == "context_length_exceeded"


def test_serving_honours_the_requests_sampling(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["a", "b"]) as (srv, engine, _):
            client = client_for(f"{srv.url}/v1")
            await client.chat.completions.create(model="m", messages=[QUESTION], temperature=0.2, top_p=0.5,
                                                 max_tokens=7, seed=5)
            text = await client.completions.create(model="m", prompt="Once upon", max_tokens=3)
            models = await client.models.list()
            return engine, text, models
    engine, text, models = asyncio.run(run())
    call = engine.calls[0]
    assert (call.temperature, call.top_p, call.max_tokens, call.seed) == (0.2, 0.5, 7, 5)
    assert engine.calls[1].prompt_ids == engine.encode("Once upon") and text.choices[0].text == "b"
    assert [m.id for m in models.data] == ["agentrl"]


def test_text_completions_extend_the_ledger(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, [Reply(" one", eos=False), Reply(" three", eos=False)]) as (srv, engine, fmt):
            ep = Episode("t", 0)
            client = client_for(srv.open_session(engine, ep).base_url)
            a = await client.completions.create(model="m", prompt="Count:", max_tokens=20)
            await client.completions.create(model="m", prompt="Count:" + a.choices[0].text + " two", max_tokens=20)
            return ep, fmt
    ep, fmt = asyncio.run(run())
    assert not ep.segments and fmt.tokenizer.decode(ep.tokens) == "Count: one two three"
    assert ep.loss_mask == [0] * len(fmt.encode("Count:")) + [1] * len(fmt.encode(" one")) + \
        [0] * len(fmt.encode(" two")) + [1] * len(fmt.encode(" three"))


def test_errors_are_in_openais_shape(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["a"]) as (srv, engine, _):
            base = srv.open_session(engine, Episode("t", 0)).base_url
            async with httpx.AsyncClient() as http:
                bad = await http.post(f"{base}/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
                junk = await http.post(f"{base}/chat/completions", content=b"{not json",
                                        headers={"Content-Type": "application/json"})
                n2 = await http.post(f"{base}/chat/completions", json={"messages": [QUESTION], "n": 2})
                temp = await http.post(f"{base}/chat/completions", json={"messages": [QUESTION], "temperature": 9})
                gone = await http.post(f"{srv.url}/sessions/nope/v1/chat/completions", json={"messages": [QUESTION]})
            return bad, junk, n2, temp, gone
    bad, junk, n2, temp, gone = asyncio.run(run())
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages[0].role"
    assert junk.status_code == 400 and "not valid JSON" in junk.json()["error"]["message"]
    assert n2.json()["error"]["param"] == "n" and temp.json()["error"]["param"] == "temperature"
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"


def test_forced_tools_and_structured_output_are_refused_the_same_way_on_both_apis(tiny_tokenizer):
    """LangChain's with_structured_output forces a tool (tool_choice "required" or a named function):
    sampling here is not constrained, so both APIs refuse it by name rather than answer free text."""
    named = {"type": "function", "function": {"name": "calculator"}}
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}

    async def run():
        async with served(tiny_tokenizer, ["a"] * 8) as (srv, engine, _):
            base = srv.open_session(engine, Episode("t", 0)).base_url
            out = {}
            async with httpx.AsyncClient() as http:
                for name, choice in (("required", "required"), ("named", named), ("none", "none")):
                    chat = await http.post(f"{base}/chat/completions",
                                           json={"messages": [QUESTION], "tools": [tool], "tool_choice": choice})
                    resp = await http.post(f"{base}/responses", json={"input": "hi", "tool_choice": choice,
                                                                       "tools": [{"type": "function", "name": "calculator"}]})
                    out[name] = (chat, resp)
                out["format"] = (await http.post(f"{base}/chat/completions", json={
                    "messages": [QUESTION], "response_format": {"type": "json_object"}}), None)
                out["auto"] = (await http.post(f"{base}/chat/completions",
                                               json={"messages": [QUESTION], "tools": [tool], "tool_choice": "auto"}), None)
            return out
    out = asyncio.run(run())
    for name in ("required", "named", "none"):
        chat, resp = out[name]
        assert chat.status_code == resp.status_code == 400, (name, chat.text, resp.text)
        assert chat.json()["error"]["param"] == resp.json()["error"]["param"] == "tool_choice"
        assert chat.json()["error"]["message"] == resp.json()["error"]["message"]
        assert "only 'auto'" in chat.json()["error"]["message"]
    fmt = out["format"][0]
    assert fmt.status_code == 400 and fmt.json()["error"]["param"] == "response_format"
    assert out["auto"][0].status_code == 200


def test_engine_failure_is_a_500_and_leaves_the_ledger_as_it_was(tiny_tokenizer):
    def script(prompt, index):
        raise RuntimeError("EngineDeadError: core died")

    async def run():
        async with served(tiny_tokenizer, script) as (srv, engine, _):
            ep = Episode("t", 0)
            session = srv.open_session(engine, ep)
            with pytest.raises(openai.InternalServerError) as err:
                await client_for(session.base_url).chat.completions.create(model="m", messages=[QUESTION])
            return ep, session, err.value
    ep, session, err = asyncio.run(run())
    assert err.body["code"] == "engine_error" and "core died" in session.engine_error and ep.tokens == []


def test_binds_loopback_and_checks_the_bearer_token(tiny_tokenizer):
    async def run():
        async with served(tiny_tokenizer, ["a", "b"], api_key="s3cret") as (srv, engine, _):
            sockets = [s.getsockname()[0] for site in srv._runner.sites for s in site._server.sockets]
            base = f"{srv.url}/v1"
            with pytest.raises(openai.AuthenticationError) as err:
                await client_for(base, "wrong").models.list()
            async with httpx.AsyncClient() as http:
                none = await http.post(f"{base}/chat/completions", json={"messages": [QUESTION]})
            ok = await client_for(base, "s3cret").chat.completions.create(model="m", messages=[QUESTION])
            return sockets, err.value, none, ok
    sockets, err, none, ok = asyncio.run(run())
    assert sockets == ["127.0.0.1"] and ServerConfig().host == "127.0.0.1"
    assert err.status_code == 401 and none.status_code == 401 and json.loads(none.text)["error"]["code"] == "invalid_api_key"
    assert ok.choices[0].message.content == "a"


def test_streamed_text_completions_match_the_plain_ones(tiny_tokenizer):
    async def run(stream: bool):
        async with served(tiny_tokenizer, ["forty two", "x"]) as (srv, engine, _):
            ep = Episode("t", 0)
            client = client_for(srv.open_session(engine, ep).base_url)
            out = await client.completions.create(model="m", prompt="Answer:", max_tokens=20, stream=stream)
            if not stream:
                return out.choices[0].text, out.choices[0].finish_reason, ep
            chunks = [c async for c in out]
            return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason, ep
    plain, streamed = asyncio.run(run(False)), asyncio.run(run(True))
    assert plain[:2] == streamed[:2] == ("forty two", "stop")
    assert plain[2].tokens == streamed[2].tokens and plain[2].loss_mask == streamed[2].loss_mask
