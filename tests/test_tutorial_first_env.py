"""docs/tutorials/first-env.md and the files it shows (examples/tutorials/): the page's code is the shipped
code, and the warm start's teachers play the envs' own rules. Its commands run in tests/test_docs.py."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path

import pytest

from agentrl.config.load import load_config
from agentrl.env import Action
from agentrl.rollout.tools.hermes import parse
from examples.tutorials import first_env, first_env_tool

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tutorials" / "first-env.md"
SHIPPED = sorted(p for p in (REPO / "examples" / "tutorials").iterdir() if p.suffix in (".py", ".yaml"))
FENCE = re.compile(r"^```(python|yaml)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_every_python_and_yaml_block_of_the_page_is_an_excerpt_of_a_shipped_file():
    blocks = FENCE.findall(PAGE.read_text())
    assert sum(lang == "python" for lang, _ in blocks) >= 3 and sum(lang == "yaml" for lang, _ in blocks) >= 2
    texts = {p.name: p.read_text() for p in SHIPPED}
    for lang, block in blocks:
        ext = ".py" if lang == "python" else ".yaml"
        found = [name for name, text in texts.items() if name.endswith(ext) and block in text]
        assert found, f"a ```{lang} block of {PAGE.name} is in none of examples/tutorials/*{ext}:\n{block}"


def play(env, task, messages):
    """Plays a demonstration's assistant turns through `env`; checks each reply is the demonstration's
    next message; returns the last StepResult."""
    assert asyncio.run(env.reset(task)) == messages[0]["content"]
    result = None
    for i in range(1, len(messages), 2):
        calls, error = parse(messages[i]["content"])
        result = asyncio.run(env.step(Action(messages[i]["content"], calls, error)))
        if i + 1 < len(messages):
            shown = result.observation
            want = messages[i + 1]
            assert shown == (want["content"] if want["role"] == "user" else [want])
            assert not result.done
        else:
            assert result.done
    return result


@pytest.mark.parametrize("module, env_cls", [(first_env, first_env.GridWalkEnv),
                                             (first_env_tool, first_env_tool.GridWalkToolEnv)])
def test_the_teacher_plays_the_env_and_a_better_teacher_wins_more(module, env_cls):
    tasks = module.demo_tasks(300, 0, "demo")
    rates = []
    for p in (0.0, 0.5, 1.0):
        rng = random.Random(0)
        rates.append(sum(play(env_cls(), t, module.demonstration(t, rng, p)).reward for t in tasks) / len(tasks))
    assert rates[0] < rates[1] < rates[2] == 1.0
    assert json.loads(json.dumps(tasks)) == tasks


@pytest.mark.parametrize("yaml, module", [("first_env.yaml", first_env), ("first_env_tool.yaml", first_env_tool)])
def test_the_warm_start_sees_the_tasks_the_run_trains_on(yaml, module):
    cfg = load_config(str(REPO / "examples" / "tutorials" / yaml), [])
    assert cfg.model.default.task == module.__name__
    env_cls = {first_env: first_env.GridWalkEnv, first_env_tool: first_env_tool.GridWalkToolEnv}[module]
    assert cfg.env.import_path == f"{module.__name__}:{env_cls.__name__}"
    made = env_cls.make_tasks(50, 7, "demo", **cfg.data.task_kwargs)
    assert module.demo_tasks(50, 7, "demo") == made
    longest = max(t["turns"] for t in env_cls.make_tasks(2000, 0, "train", **cfg.data.task_kwargs))
    assert cfg.rollout.max_turns >= longest


def test_the_tool_call_and_mistakes():
    calls, error = parse(first_env_tool.CALL)
    assert error is None and [c.name for c in calls] == [first_env_tool.COMPASS["function"]["name"]]
    task = {"id": "t", "size": 4, "start": [0, 0], "goal": [1, 0], "turns": 3}
    env = first_env_tool.GridWalkToolEnv()
    asyncio.run(env.reset(task))
    bad = asyncio.run(env.step(Action('<tool_call>{"name": "look", "arguments": {}}</tool_call>',
                                      *parse('<tool_call>{"name": "look", "arguments": {}}</tool_call>'))))
    assert bad.observation[0]["content"].startswith("error:") and not bad.done and not bad.info["tool_success"]
    assert asyncio.run(env.step(Action("sideways"))).observation == "Say up, down, left or right."
    last = asyncio.run(env.step(Action("right")))
    assert last.done and last.reward == 1.0
