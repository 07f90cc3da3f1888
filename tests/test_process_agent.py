"""ProcessAgentEnv: real child processes (tests/fixtures/process_agents/agent.py, standard library only)
playing through the real OpenAI endpoint (aiohttp on loopback) against a scripted engine. The ledger
holds the process's requests' tokens, the reward comes from its reward file, and every way a process
can fail ends its episode with its own status and a message that says what happened."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from agentrl.config import ConfigError, RolloutConfig, ServerConfig
from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.env import load_env
from agentrl.rollout.agent_episode import make_server
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.pool import RolloutPool
from agentrl.rollout.process_agent import ProcessAgentEnv
from agentrl.rollout.process_agent.workdir import episodes_root
from tests.fake_engine import ScriptedEngine
from tests.test_e2e_tools import tool_server  # noqa: F401 (the reference tool server, a fixture)

ROOT = Path(__file__).resolve().parents[1]
AGENT = str(ROOT / "tests" / "fixtures" / "process_agents" / "agent.py")
TASK = {"id": "t0", "question": "What is 2 + 3?", "answer": "5"}


def answers(tokenizer):
    """Each episode's first reply is "4", its second "5"."""
    def script(prompt, index):
        return "5" if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1 else "4"
    return script


def agent_kwargs(mode: str, **more) -> dict:
    return {"command": ["{python}", "-I", AGENT, mode], **more}


async def play(tokenizer, kwargs, tasks, *, episode_timeout_s=30.0, scored_by_sources=False, script=None):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(tokenizer, script or answers(tokenizer))
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=128, episode_timeout_s=episode_timeout_s, temperature=1.0,
                        tool_format="hermes")
    spec = EpisodeSpec(ProcessAgentEnv, kwargs, fmt, cfg, 512, scored_by_sources=scored_by_sources)
    spec = dataclasses.replace(spec, server=make_server(spec, engine, ServerConfig()))
    await spec.server.start()
    try:
        pool = RolloutPool(engine, spec)
        episodes = await asyncio.gather(*(pool.episode(t, i, seed=i) for i, t in enumerate(tasks)))
        return episodes, fmt, spec.server
    finally:
        await spec.server.stop()


def one(tokenizer, kwargs, task=TASK, **options):
    (ep,), _, server = asyncio.run(play(tokenizer, kwargs, [task], **options))
    assert server.sessions == {}
    return ep


def test_the_process_plays_through_its_session_and_writes_its_reward(tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("FAKE_AWS_SECRET", "do-not-pass")
    tasks = [{**TASK, "id": f"t{i}", "question": f"What is 2 + {i}?"} for i in range(4)]
    kwargs = agent_kwargs("chat", env={"GREETING": "hi from {workdir}"})
    episodes, fmt, server = asyncio.run(play(tiny_tokenizer, kwargs, tasks))
    for i, ep in enumerate(episodes):
        assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True), ep.error
        final = [{"role": "user", "content": f"What is 2 + {i}?"}, {"role": "assistant", "content": "4"},
                 {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "5"}]
        tokens, mask = ledger_from_messages(fmt, final)
        assert ep.tokens == tokens and ep.loss_mask == mask and ep.messages == final
        info = ep.info["env"]
        seen, workdir = info["seen"], info["cwd"]
        assert seen["OPENAI_BASE_URL"].startswith(server.url + "/sessions/") and seen["OPENAI_BASE_URL"].endswith("/v1")
        assert seen["ANTHROPIC_BASE_URL"] == seen["OPENAI_BASE_URL"][:-len("/v1")]
        assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_API_KEY"] == server.cfg.api_key.get_secret_value()
        assert seen["AGENTRL_WORKDIR"] == workdir and seen["GREETING"] == f"hi from {workdir}"
        assert seen["FAKE_AWS_SECRET"] is None  # the trainer's other variables stay out
        assert info["same_task"] and not os.path.exists(workdir)  # the task file held the task; folder removed
    assert len({ep.info["env"]["seen"]["OPENAI_BASE_URL"] for ep in episodes}) == 4
    assert os.listdir(episodes_root()) == []


@pytest.mark.parametrize("mode, error", [
    ("exit3", "the agent process exited with code 3: the agent's own failure"),
    ("signal", "the agent process was killed by SIGTERM"),
    ("silent", "the agent returned without making a request"),
    ("no_reward", "exited 0 without writing its reward file {reward_file} (reward.json"),
    ("bad_json", "its reward file {reward_file} (reward.json in its working directory) is not JSON"),
    ("nan", "has reward 'lots'"),
])
def test_each_failure_is_its_own_env_error(tiny_tokenizer, mode, error):
    ep = one(tiny_tokenizer, agent_kwargs(mode))
    assert (ep.status, ep.reward) == ("env_error", 0.0) and error in ep.error, ep.error
    if mode == "exit3":
        assert "the agent's own failure" in ep.traceback and "starting" in ep.traceback  # both tails kept


def test_a_program_that_fails_before_its_first_request_says_so(tiny_tokenizer):
    ep = one(tiny_tokenizer, {"command": ["{python}", "-c", "import sys; sys.exit('no config found')"]})
    assert ep.status == "env_error"
    assert ep.error.endswith("exited with code 1: no config found (it never called the model)"), ep.error
    ep = one(tiny_tokenizer, {"command": ["./not-there"]})
    assert ep.status == "env_error" and "cannot start the agent process './not-there'" in ep.error, ep.error


def pid_alive(pid: int) -> bool:
    """A zombie (killed, not yet reaped by its new parent) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hang_is_a_timeout_and_its_whole_group_dies(tiny_tokenizer, tmp_path):
    pids_file = tmp_path / "pids"
    ep = one(tiny_tokenizer, agent_kwargs("hang", env={"PIDS_FILE": str(pids_file)}), episode_timeout_s=3.0)
    assert (ep.status, ep.error) == ("timeout", "episode deadline exceeded")
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids)
    assert ep.n_generated > 0  # its one request is in the ledger, dropped with the episode as a timeout


def test_sources_score_the_conversation_and_the_file_is_not_read(tiny_tokenizer):
    ep = one(tiny_tokenizer, agent_kwargs("no_reward", reward="sources"), scored_by_sources=True)
    assert ep.status == "ok" and ep.n_generated > 0


@pytest.mark.parametrize("kwargs, message", [
    ({"command": "python agent.py"}, "env.kwargs.command: is the string 'python agent.py'; give the argv as a list"),
    ({"command": []}, "env.kwargs.command: must be a non-empty list"),
    ({"command": ["x", "{task-file}"]}, "env.kwargs.command[1]: '{task-file}' names the unknown template"),
    ({"command": ["x"], "stdin": "file"}, "env.kwargs.stdin: 'file' is not one of json, none"),
    ({"command": ["x"], "reward": "file"}, "env.kwargs.reward"),
    ({"command": ["x"], "env": {"OPENAI_API_KEY": "k"}}, "env.kwargs.env.OPENAI_API_KEY: is set for each episode"),
    ({"command": ["x"], "tasks_from": "envs.calculator:CalculatorEnv"}, "set it in data.task_kwargs"),
    ({"command": ["x"], "comand": 1}, "env.kwargs.comand: unknown key"),
])
def test_settings_are_checked_at_start_up_naming_the_key(kwargs, message):
    with pytest.raises(ConfigError) as info:
        ProcessAgentEnv.prestart(**kwargs)
    assert message in str(info.value), str(info.value)


def test_tasks_come_from_the_env_named_by_tasks_from():
    from envs.calculator import CalculatorEnv

    env_cls = load_env("agentrl.rollout.process_agent:ProcessAgentEnv")
    kwargs = {"low": 10, "high": 99, "ops": "+-*"}
    tasks = env_cls.make_tasks(8, 3, "eval", tasks_from="envs.calculator:CalculatorEnv", **kwargs)
    assert tasks == CalculatorEnv.make_tasks(8, 3, "eval", **kwargs)
    with pytest.raises(NotImplementedError, match="data.task_kwargs.tasks_from"):
        env_cls.make_tasks(8, 3, "eval")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_sandboxed_the_process_reaches_only_its_own_session(tiny_tokenizer, tmp_path):
    ep = one(tiny_tokenizer, agent_kwargs("probe", sandbox=True, env={"GREETING": "sandboxed"}))
    assert (ep.status, ep.reward) == ("ok", 1.0), (ep.error, ep.traceback[-2000:])
    info = ep.info["env"]
    assert info["seen"]["OPENAI_BASE_URL"].startswith("http://127.0.0.1:8080/sessions/")
    assert info["seen"]["GREETING"] == "sandboxed" and info["reach"]["home"] == info["cwd"]
    assert info["reach"]["codes"] == [403, 403] and info["reach"]["outside"] is False
    assert n_messages(ep) == 4  # both requests went through the proxy into the ledger


def n_messages(ep) -> int:
    return len(ep.messages)


def test_the_example_program_plays_the_calculator_as_the_openai_agent_does(tiny_tokenizer, request):
    """examples/agents/process_calculator.py with a scripted model: a tool call, then the answer. The
    conversation in the ledger is CalculatorEnv's (compact tools line, result as the tool message), in
    one segment: each request re-sent the reply as returned."""
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 + 30"}}</tool_call>'
    tools_url = request.getfixturevalue("tool_server")  # tests/test_e2e_tools.py's, imported above
    kwargs = {"command": ["{python}", "-I", "{run_cwd}/examples/agents/process_calculator.py", "3"],
              "env": {"CALCULATOR_TOOL_URL": tools_url}}
    task = {"id": "c0", "a": 12, "op": "+", "b": 30, "answer": 42}
    ep = one(tiny_tokenizer, kwargs, task, script=[call, "42"])
    assert (ep.status, ep.reward, ep.success) == ("ok", 1.0, True), (ep.error, ep.messages)
    assert ep.info["env"] == {"success": True, "tool_success": True, "turns": 2}
    roles = [(m["role"], m.get("content")) for m in ep.messages]
    assert roles[:2] == [("system", "Tools: calculator, lookup."), ("user", "What is 12 + 30?")]
    assert roles[2:] == [("assistant", call), ("tool", "42"), ("assistant", "42")]  # the turns as sampled
    assert not ep.segments and ep.info["tool_calls"] == 1
