"""envs.verifiers_env: verifiers (0.4, `verifiers.v1`) environments played by their own rollout.

Each episode runs the environment's harness program (verifiers' chat loop, a real subprocess on this
interpreter) through verifiers' interception server to agentrl's OpenAI endpoint (real aiohttp on
loopback) over a scripted engine, then the task's own reward functions score it. Rewards are exact,
the ledger holds the conversation, and a raising reward function is an env_error naming it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from pathlib import Path

import verifiers.v1  # noqa: F401  (scripts/install.sh installs it; missing, this file fails)

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import RolloutConfig, ServerConfig
from agentrl.rollout.agent_episode import make_server
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.pool import RolloutPool
from envs.verifiers_env import VerifiersEnv
from tests.fake_engine import ScriptedEngine
from tests.fixtures.vf_envs.common import WORDS
from tests.fixtures.vf_envs.single_turn import demo_tasks, demonstration

FIXTURES = "tests.fixtures.vf_envs"


def tasks(module: str, n: int, split: str = "train") -> list[dict]:
    return VerifiersEnv.make_tasks(n, 0, split, load=f"{FIXTURES}.{module}:load_environment")


async def _play(tokenizer, script, task_list, max_turns: int = 4, tool_format: str = "hermes"):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(tokenizer, script)
    cfg = RolloutConfig(max_turns=max_turns, max_tokens_per_turn=64, episode_timeout_s=60.0, temperature=1.0,
                        tool_format=tool_format)
    spec = EpisodeSpec(VerifiersEnv, {}, fmt, cfg, 1024)
    spec = dataclasses.replace(spec, server=make_server(spec, engine, ServerConfig()))
    await spec.server.start()
    try:
        pool = RolloutPool(engine, spec)
        return await asyncio.gather(*(pool.episode(t, i, seed=i) for i, t in enumerate(task_list)))
    finally:
        await spec.server.stop()


def play(tokenizer, script, task_list, **kwargs):
    return asyncio.run(_play(tokenizer, script, task_list, **kwargs))


def prompt_text(tokenizer, prompt_ids) -> str:
    return tokenizer.decode(prompt_ids)


def asked_word(tokenizer, prompt_ids) -> str:
    """The word the fixtures' first user message asks for: "Reply with the word <word>."."""
    return prompt_text(tokenizer, prompt_ids).split("Reply with the word ", 1)[1].split(".", 1)[0]


def test_single_turn_env_scores_its_own_rubric(tiny_tokenizer):
    task_list = tasks("single_turn", 3)
    json.dumps(task_list)  # checkpointable as they are

    def script(prompt, index):  # right for "apple", "river", "stone"; wrong otherwise
        word = asked_word(tiny_tokenizer, prompt)
        return word if word in ("apple", "river", "stone") else "nope"

    episodes = play(tiny_tokenizer, script, task_list)
    for task, ep in zip(task_list, episodes):
        answer = task["data"]["answer"]
        right = answer in ("apple", "river", "stone")
        assert ep.status == "ok", (ep.status, ep.error)
        assert ep.reward == float(right) and ep.success == right
        assert ep.info["env"]["vf/exact_match"] == float(right)
        assert ep.info["env"]["vf/reply_chars"] == float(len(answer if right else "nope"))
        assert ep.messages == [{"role": "user", "content": f"Reply with the word {answer}."},
                               {"role": "assistant", "content": answer if right else "nope"}]


def test_multi_turn_env_plays_both_turns_on_one_ledger(tiny_tokenizer):
    task_list = tasks("multi_turn", 2)

    def script(prompt, index):  # first reply hedges; after "Are you sure?" the word (or not, for "stone")
        word = asked_word(tiny_tokenizer, prompt)
        if "Are you sure?" not in prompt_text(tiny_tokenizer, prompt):
            return "maybe"
        return "no" if word == "stone" else word

    episodes = play(tiny_tokenizer, script, task_list)
    for task, ep in zip(task_list, episodes):
        answer = task["data"]["answer"]
        last = "no" if answer == "stone" else answer
        assert ep.status == "ok", (ep.status, ep.error)
        assert ep.reward == float(last == answer)
        assert ep.messages == [{"role": "user", "content": f"Reply with the word {answer}."},
                               {"role": "assistant", "content": "maybe"},
                               {"role": "user", "content": "Are you sure? Reply with the word again."},
                               {"role": "assistant", "content": last}]
        assert not ep.segments, ep.segments  # the second request extended the first: one ledger
        assert len(ep.turns) == 2


def test_tool_env_calls_the_python_tool(tiny_tokenizer, monkeypatch):
    # verifiers runs the tool server as `python -m tests.fixtures.vf_envs.tool_env` in a scratch folder
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    task_list = tasks("tool_env", 2)

    def script(prompt, index):
        text = prompt_text(tiny_tokenizer, prompt)
        if text.count("<|im_start|>assistant") == 1:
            a, b = text.rsplit("What is ", 1)[1].split("?", 1)[0].split(" + ")
            return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        return text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>", 1)[0]  # the tool's result

    episodes = play(tiny_tokenizer, script, task_list)
    for task, ep in zip(task_list, episodes):
        assert ep.status == "ok", (ep.status, ep.error)
        assert ep.reward == 1.0 and ep.success
        assert ep.info["env"]["vf/tool_results"] == 1.0
        assert ep.messages[-1] == {"role": "assistant", "content": task["data"]["answer"]}
        assert ep.messages[-2]["role"] == "tool" and ep.messages[-2]["content"] == task["data"]["answer"]


def test_a_raising_rubric_ends_the_episode_with_an_error_not_a_zero(tiny_tokenizer):
    (ep,) = play(tiny_tokenizer, lambda prompt, index: "apple", tasks("raising", 1))
    assert ep.status == "env_error" and ep.reward == 0.0 and not ep.success
    assert "broken_reward" in ep.error and "ZeroDivisionError" in ep.error, ep.error
    assert ep.messages[-1]["role"] == "assistant"  # the conversation still trained-ready on the ledger


def test_tasks_are_json_naming_their_env_and_row():
    train = tasks("single_turn", 8)
    assert json.loads(json.dumps(train)) == train
    assert len(train) == 8 and {t["data"]["answer"] for t in train} == {"apple", "river", "stone", "cloud",
                                                                        "ember", "maple"}
    first = train[0]
    assert first["env"] == {"load": f"{FIXTURES}.single_turn:load_environment"}
    assert first["prompt"] == f"Reply with the word {first['data']['answer']}." == first["data"]["prompt"]
    assert first["index"] == first["data"]["idx"] and first["data"]["id"] == f"w{first['index']}"
    assert tasks("single_turn", 8) == train
    assert VerifiersEnv.make_tasks(8, 1, "train", load=first["env"]["load"]) != train  # the seed shuffles


def test_an_installed_taskset_id_loads_with_a_local_chat_agent(tiny_tokenizer):
    """`load: <taskset id>` goes through vf.load_environment; the adapter's default agent is verifiers'
    chat harness in the subprocess runtime. (The fixture module stands in for an installed package.)"""
    from tests.fixtures.vf_envs import single_turn
    from tests.fixtures.vf_envs.common import taskset_id

    task_list = VerifiersEnv.make_tasks(2, 0, "train", load=taskset_id(single_turn.__name__))
    assert task_list[0]["env"] == {"load": "tests_fixtures_vf_envs_single_turn"}
    episodes = play(tiny_tokenizer, lambda prompt, index: "ember", task_list)
    assert [(ep.status, ep.reward) for ep in episodes] == [("ok", float(t["data"]["answer"] == "ember"))
                                                           for t in task_list]


def test_the_warm_start_demonstrations_are_the_conversation_the_rollout_trains_on(tiny_tokenizer):
    """examples/agents/verifiers.yaml warm-starts the default model on the fixture's own demonstrations:
    they must be, token for token, the ledger verifiers' harness produces through the endpoint."""
    task_list = tasks("single_turn", 6)
    episodes = play(tiny_tokenizer, lambda prompt, index: asked_word(tiny_tokenizer, prompt), task_list)
    fmt = ChatFormat(tiny_tokenizer)
    for task, ep in zip(task_list, episodes):
        demo = demonstration({"prompt": task["data"]["prompt"], "answer": task["data"]["answer"]},
                             random.Random(0), 1.0)
        assert ep.status == "ok" and ep.reward == 1.0, (ep.status, ep.error)
        assert ep.messages == demo
        assert (ep.tokens, ep.loss_mask) == ledger_from_messages(fmt, demo)

    # the teacher: the asked word `optimal_prob` of the time, another of the six words otherwise
    rng = random.Random(0)
    demos = [(t, demonstration(t, rng, 0.5)[1]["content"]) for t in demo_tasks(2000, 0, "demo")]
    assert {t["prompt"] for t, _ in demos} == {f"Reply with the word {w}." for w in WORDS}
    assert all(reply in WORDS for _, reply in demos)
    right = sum(reply == t["answer"] for t, reply in demos)
    assert 900 < right < 1100  # 1000 expected, sd 22
    assert all(demonstration(t, rng, 0.0)[1]["content"] != t["answer"] for t, _ in demos[:200])
