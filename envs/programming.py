"""Programming tasks with hidden unit tests run in the code sandbox: "Write a Python function ...".

The model writes a function; the env sends its code and the task's hidden tests to the sandbox
server (`python -m rewards.servers.sandbox --port 8766`) as one `python` tool call, a harness
(`harness_program`) that runs each test on its own and prints one JSON line of per-test results. The
reward is the share of tests passed (or, with `reward_mode: pass`, 1 only when all pass); `success`
(the pass/fail verifier: every test passed) feeds the success rate and pass@k.

What the model's code does is a recorded outcome (`info["outcome"]`), never a crash of the run:
`passed`, `failed` (some tests failed), `no_code` (an empty reply), `compile_error` (a syntax
error), `runtime_error` (the module raised or exited while being defined), `timeout` (the sandbox's
deadline) and `no_result` (the program ended with no result line: killed for memory, `os._exit`, ...).
Each scores what it earned, 0 when no test passed. A sandbox that cannot be reached, or answers a
call with an infrastructure failure, is not the model's doing: the env raises `RemoteToolError` and
the episode ends with status env_error, counted, never scored as 0.

The result line is found by a random marker the model never sees, and the harness keeps its own
references to the output stream before the model's code runs, so a reply that prints something
result-shaped scores nothing by it. A program written to defeat the harness (walking the
interpreter's frames for the marker) could still forge it: the hidden tests are a reward, the
sandbox is the security boundary.

Tasks: `envs/data/programming.jsonl`, 48 small functions with 3-5 tests each and a reference
solution; every third one is held out (`split: eval`).
"""

from __future__ import annotations

import json
import random
import re
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.env import Action, Env, Message, StepResult
from agentrl.rollout.tools.client import RemoteToolClient, RemoteToolError, named_client, shared_client

DATA = Path(__file__).parent / "data" / "programming.jsonl"
TOOL = "python"  # the sandbox's tool (rewards.servers.sandbox)
OUTCOMES = ("passed", "failed", "no_code", "compile_error", "runtime_error", "timeout", "no_result")

# Run by the sandbox's python (the system interpreter, stdlib only). {args} is a repr'd dict.
_HARNESS = r'''
import io as _io, json as _json, signal as _signal, sys as _sys
_A = {args}
_write, _flush, _dumps = _sys.__stdout__.write, _sys.__stdout__.flush, _json.dumps
class _Timeout(BaseException):
    pass
def _alarm(signum, frame):
    raise _Timeout()
class _Capped(_io.StringIO):  # the model's own prints, kept short so the result line is never cut
    def write(self, s):
        return _io.StringIO.write(self, s[:max(0, 2000 - self.tell())])
def _report(**kw):
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    _write("\n" + _A["mark"] + _dumps(kw) + "\n")
    _flush()
def _why(e):
    return "timeout" if isinstance(e, _Timeout) else (type(e).__name__ + ": " + str(e))[:300]
_signal.signal(_signal.SIGALRM, _alarm)
_sys.stdout = _sys.stderr = _Capped()
try:
    _code = compile(_A["solution"], "solution.py", "exec")
except (SyntaxError, ValueError) as _e:
    _report(outcome="compile_error", error=_why(_e))
    raise SystemExit(0)
_ns = {"__name__": "solution"}
try:
    _signal.setitimer(_signal.ITIMER_REAL, _A["timeout"])
    exec(_code, _ns)
    _signal.setitimer(_signal.ITIMER_REAL, 0)
except BaseException as _e:
    _report(outcome="timeout" if isinstance(_e, _Timeout) else "runtime_error", error=_why(_e))
    raise SystemExit(0)
_passed, _errors = [], []
for _mode, _src in _A["tests"]:
    _err = None
    try:
        _signal.setitimer(_signal.ITIMER_REAL, _A["timeout"])
        if _mode == "eval":
            _err = None if bool(eval(_src, _ns)) else "false: " + _src[:200]
        else:
            exec(_src, _ns)
    except BaseException as _e:
        _err = _why(_e)
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    _passed.append(_err is None)
    _errors.append(_err)
_report(outcome="tests", passed=_passed, errors=_errors)
'''


@dataclass(frozen=True)
class ProgramRun:
    """What one program did against its tests."""

    outcome: str  # one of OUTCOMES
    passed: list[bool] = field(default_factory=list)  # per test, in order; [] when no test ran
    error: str | None = None  # the first error, for the log and the episode's info

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def harness_program(solution: str, tests: list[tuple[str, str]], mark: str, timeout_s: float) -> str:
    """The program the sandbox runs: `solution`, then each test ("eval", expr): passes when truthy;
    ("exec", statements): passes when nothing raises, each under its own `timeout_s` alarm."""
    args = {"solution": solution, "tests": [list(t) for t in tests], "mark": mark, "timeout": timeout_s}
    return _HARNESS.replace("{args}", repr(args), 1)


def read_result(content: str, is_error: bool, mark: str, n_tests: int) -> ProgramRun:
    """The ProgramRun from the sandbox's reply to `harness_program` (the last line carrying `mark`)."""
    lines = [line[len(mark):] for line in content.splitlines() if line.startswith(mark)]
    if not lines:
        timed_out = is_error and "timeout" in content.lower()
        return ProgramRun("timeout" if timed_out else "no_result", error=content[-300:] or None)
    body = json.loads(lines[-1])
    if body["outcome"] != "tests":
        return ProgramRun(body["outcome"], [False] * n_tests, body.get("error"))
    passed = [bool(p) for p in body["passed"]]
    first = next((e for e in body["errors"] if e), None)
    return ProgramRun("passed" if all(passed) else "failed", passed, first)


async def run_tests(client: RemoteToolClient, solution: str, tests: list[tuple[str, str]],
                    timeout_s: float = 1.0, key: str | None = None) -> ProgramRun:
    """Run `solution` against `tests` in the sandbox behind `client`; RemoteToolError when the sandbox
    itself failed (that is never the model's outcome)."""
    if not solution.strip():
        return ProgramRun("no_code", [False] * len(tests))
    mark = f"@@agentrl-tests-{secrets.token_hex(8)}@@"
    result = await client.call(TOOL, {"code": harness_program(solution, tests, mark, timeout_s)}, key)
    if not result.ok:
        info = result.info
        raise RemoteToolError(f"sandbox at {client.config.url} failed ({result.status}, {info.get('kind')}, "
                              f"{info.get('attempts')} attempt(s)): {info.get('error')}")
    return read_result(result.content, bool(result.info.get("is_error")), mark, len(tests))


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a reply: the first fenced block that defines `entry_point` (else the first fenced
    block; an unclosed one runs to the end, as a reply cut at its token limit does), else the whole text."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return text
    defining = [b for b in blocks if entry_point and re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.M)]
    return (defining or blocks)[0]


def load_tasks(split: str, path: Path = DATA) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return [r for r in rows if r["split"] == split]


def task_prompt(task: dict[str, Any]) -> str:
    return (f"Write a Python function `{task['signature'][4:-1]}`. {task['description']}\n"
            "Reply with only the code in a ```python block.")


class ProgrammingEnv(Env):
    def __init__(self, tool_server: str | None = None, tool_url: str | None = None,
                 client: dict[str, Any] | None = None, test_timeout_s: float = 1.0,
                 reward_mode: str = "fraction") -> None:
        """`tool_server`: the sandbox's name in the config's `tools.servers`; or, outside a config,
        `tool_url` with `client` settings (ToolServerConfig fields). `test_timeout_s`: each test's own
        deadline inside the sandbox (the server's per-call limit bounds the whole program).
        `reward_mode`: "fraction" (share of tests passed) or "pass" (1 only when all pass)."""
        if (tool_url is None) == (tool_server is None):
            raise ValueError("ProgrammingEnv takes one of tool_server (a name in tools.servers) or tool_url")
        if reward_mode not in ("fraction", "pass"):
            raise ValueError(f"reward_mode must be 'fraction' or 'pass', got {reward_mode!r}")
        self.tool_server, self.tool_url, self.client_config = tool_server, (tool_url or "").rstrip("/"), client or {}
        self.test_timeout_s, self.reward_mode = test_timeout_s, reward_mode
        self.episode_key = uuid.uuid4().hex

    def sandbox_client(self) -> RemoteToolClient:
        return named_client(self.tool_server) if self.tool_server else shared_client(self.tool_url, **self.client_config)

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task = task
        return [{"role": "user", "content": task_prompt(task)}]

    async def step(self, action: Action) -> StepResult:
        code = extract_code(action.text, self.task["entry_point"])
        tests = [("eval", t) for t in self.task["tests"]]
        run = await run_tests(self.sandbox_client(), code, tests, self.test_timeout_s, f"{self.episode_key}:0")
        success = run.outcome == "passed"
        reward = run.fraction if self.reward_mode == "fraction" else float(success)
        return StepResult(None, reward, True, {"success": success, "outcome": run.outcome,
                                               "tests_passed": sum(run.passed), "tests_total": len(tests),
                                               "error": run.error})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        """`n` tasks of `split`, shuffled by `seed`; past the split's size they repeat (fresh ids), so
        `n` at most 32 (train) / 16 (eval) gives distinct functions."""
        pool = load_tasks(split)
        random.Random(f"programming:{split}:{seed}").shuffle(pool)
        picked = [pool[i % len(pool)] for i in range(n)]  # the reference solution stays out of the episode's records
        return [{**{k: v for k, v in task.items() if k != "solution"}, "id": f"{split}-{i}", "task": task["id"]}
                for i, task in enumerate(picked)]
