"""A newcomer's own task on the embedded default: the teacher is tried before anything is built and its
failure is one line naming file:line and the task; the task may be a .py file; the cache key follows the
teacher's code; the teacher's strength defaults by task; a scripted dry run builds no weights and replays
the teacher's best play through the env; a warm start too weak for RL stops the run after its first eval."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.config import DefaultModelConfig, load_config
from agentrl.models import demos
from agentrl.models.default import _key

ROOT = Path(__file__).resolve().parents[1]

# A task of the newcomer's kind: several right answers a turn (any even number), one retry.
TASK = '''
import random
from agentrl.env import Env, StepResult

PROMPT = "Say an even number below {n}."


class EvenEnv(Env):
    def __init__(self, **kwargs):
        self.tries = 0

    async def reset(self, task):
        self.task = task
        return PROMPT.format(n=task["n"])

    async def step(self, action):
        self.tries += 1
        text = action.text.strip()
        ok = text.isdigit() and int(text) % 2 == 0 and int(text) < self.task["n"]
        if ok or self.tries == 2:
            return StepResult(None, REWARD if ok else 0.0, True)
        return StepResult("No. Again.", 0.0, False)

    @classmethod
    def make_tasks(cls, n, seed, split):
        rng = random.Random(f"{split}:{seed}")
        return [{"id": f"{split}-{i}", "n": rng.randint(4, 9)} for i in range(n)]


REWARD = 1.0


def demo_tasks(n, seed, split):
    return EvenEnv.make_tasks(n, seed, split)


def demonstration(task, rng, optimal_prob):
    messages = [{"role": "user", "content": PROMPT.format(n=task["n"])}]
    for turn in range(2):
        good = rng.random() < optimal_prob
        guess = rng.choice(GOOD(task)) if good else rng.choice([1, 3, 5, 7, 9])
        messages.append({"role": "assistant", "content": str(guess)})
        if good:
            break
        if turn == 0:
            messages.append({"role": "user", "content": "No. Again."})
    return messages


def GOOD(task):
    return [k for k in range(0, task["n"], 2)]
'''


def _write(folder: Path, text: str = TASK, name: str = "even_task.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _yaml(folder: Path, task: str = "even_task.py", extra: str = "") -> Path:
    path = folder / "even.yaml"
    path.write_text(f"model:\n  default:\n    task: {task}\n{extra}env:\n  import_path: even_task:EvenEnv\n"
                    "data:\n  eval_tasks: 8\n")
    return path


def _cli(folder: Path, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTRL_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_crashing_demonstration_is_one_line_naming_file_line_and_task_before_any_build(tmp_path):
    src = _write(tmp_path, TASK.replace("return [k for k in range(0, task[\"n\"], 2)]",
                                        "return [k for k in range(0, task[\"n\"] - 4, 2)]"))
    line = next(i for i, text in enumerate(src.read_text().splitlines(), 1) if "rng.choice(GOOD(task))" in text)
    done = _cli(tmp_path, "agentrl.check", "--config", str(_yaml(tmp_path)), "--policy", "scripted",
                cache=tmp_path / "cache")
    assert done.returncode == 2, done.stderr[-2000:]
    error = [x for x in done.stderr.splitlines() if x.startswith("config error:")]
    assert len(error) == 1 and "Traceback" not in done.stderr
    assert "model.default.task='even_task.py': demonstration(task " in error[0]
    assert "IndexError: Cannot choose from an empty sequence" in error[0]
    assert f"(at {src}:{line} in demonstration)" in error[0]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing was built


def test_an_import_failure_or_a_missing_teacher_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write(tmp_path, "x = 1\ndef demo_tasks(n, seed, split):\n    return [\n", name="broken_task.py")
    with pytest.raises(demos.TeacherError, match=r"broken_task.py:3 raised SyntaxError at import: .*was never closed"):
        demos.demo_source("broken_task.py")
    _write(tmp_path, "import math\nmath.sqrt(-1)\n", name="raising_task.py")
    with pytest.raises(demos.TeacherError, match=r"raising_task.py:2 raised ValueError at import: math domain error"):
        demos.demo_source("raising_task.py")
    with pytest.raises(demos.TeacherError, match="no such file"):
        demos.demo_source("nowhere/task.py")


def test_a_file_path_under_the_working_folder_is_the_module_it_names(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert demos.task_module("examples/agents/custom_env.py") is demos.task_module("examples.agents.custom_env")
    assert load_config(None, ["model.default.task=examples/agents/custom_env.py"]).model.default.task.endswith(".py")


def test_the_cache_key_follows_the_teachers_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, name="keyed_task.py")
    cfg = DefaultModelConfig(task=str(path))
    first = _key(cfg)
    assert _key(cfg) == first
    path.write_text(TASK.replace("rng.choice([1, 3, 5, 7, 9])", "rng.choice([1, 3, 5])"))
    monkeypatch.setattr(sys, "modules", {k: v for k, v in sys.modules.items() if "keyed_task" not in k})
    assert _key(cfg) != first  # the teacher changed: the model is built anew
    assert _key(DefaultModelConfig(demo_optimal_prob=0.3)) == _key(DefaultModelConfig())  # the built-in's own 0.3


def test_the_teachers_strength_defaults_by_task(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write(tmp_path, name="plain_task.py")
    _write(tmp_path, TASK + "\nDEMO_OPTIMAL_PROB = 0.7\n", name="strong_task.py")
    assert demos.optimal_prob("guess_number", None) == demos.optimal_prob("calculator", None) == 0.3
    assert demos.optimal_prob("plain_task.py", None) == demos.USER_OPTIMAL_PROB == 0.5
    assert demos.optimal_prob("strong_task.py", None) == 0.7 and demos.optimal_prob("strong_task.py", 0.2) == 0.2


def test_the_start_verdict_names_the_fix():
    cfg = DefaultModelConfig(task="calculator")
    why = demos.start_verdict(0.104, 0.1, cfg)
    assert why and "scored 0.104" in why and "min_start_reward=0.15" in why
    assert "demo_optimal_prob, now 0.3" in why and "sft_steps, now 300" in why and "min_start_reward=null" in why
    assert demos.start_verdict(0.15, 0.1, cfg) is None
    assert demos.start_verdict(0.0, 0.0, cfg.model_copy(update={"min_start_reward": None})) is None


def test_a_scripted_dry_run_builds_no_weights_and_replays_the_teacher(tmp_path):
    _write(tmp_path)
    cache = tmp_path / "cache"
    done = _cli(tmp_path, "agentrl.check", "--config", str(_yaml(tmp_path)), "--policy", "scripted", "--reply", "2",
                cache=cache)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [p.name.split("-")[1] for p in cache.iterdir()] == ["tokenizer"]  # no model folder: no weights
    assert "(its tokenizer: a scripted check needs no weights)" in done.stdout
    assert "=== teacher (even_task.py): its best play on 4 demo tasks, replayed through the env: " \
           "1.000 1.000 1.000 1.000" in done.stdout
    # A teacher whose best play the env does not reward is reported, and fails the check.
    _write(tmp_path, TASK.replace("REWARD = 1.0", "REWARD = 0.0"))
    done = _cli(tmp_path, "agentrl.check", "--config", str(_yaml(tmp_path)), "--policy", "scripted",
                cache=cache)
    assert done.returncode == 1
    assert "check failed: the env scores 4 of 4 of the teacher's best demonstrations 0 or less (first: demo " \
           "task 0, reward 0.000)" in done.stdout


@pytest.mark.e2e
def test_a_warm_start_too_weak_for_rl_stops_the_run_after_its_first_eval(tmp_path):
    """A real run (vLLM engine, DeepSpeed learner) on a 2-step warm start: it stops after the held-out eval
    before RL with exit 2 and the one-line message, having trained no step."""
    _write(tmp_path)
    tiny = "    sft_steps: 2\n    sft_demos: 32\n    sft_batch_size: 8\n    hidden_size: 64\n    num_layers: 1\n"
    done = _cli(tmp_path, "agentrl.train", "--config", str(_yaml(tmp_path, extra=tiny)), "train.steps=2",
                "train.out_dir=runs/even", "rollout.max_tokens_per_turn=4", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stderr[-3000:]
    error = [x for x in done.stderr.splitlines() if x.startswith("config error:")]
    assert len(error) == 1 and "below model.default.min_start_reward=0.15" in error[0]
    assert "model.default.demo_optimal_prob, now 0.5" in error[0] and "sft_steps, now 2" in error[0]
    assert not (tmp_path / "runs" / "even" / "metrics.jsonl").exists() or \
        (tmp_path / "runs" / "even" / "metrics.jsonl").read_text() == ""
