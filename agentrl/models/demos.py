"""The warm start's teacher: where `model.default.task` comes from, how strong its demonstrations are,
which code they come from (part of the cache key), and a try of the teacher before anything is built.

A task is a built-in name (`envs.<name>`), a dotted module (`my_pkg.my_env`) or a `.py` file. A file under
the folder the command runs from is imported as the module its path names (`examples/agents/custom_env.py`
is `examples.agents.custom_env`, the same module object the env's `env.import_path` gives); any other file
is loaded under a name of its own.

The teacher is tried first (`try_teacher`): a few demo tasks, each demonstration at the configured
strength and at the extremes 0 and 1. Its failures are the same one line as an Env's, naming the user's
file:line and the task, raised as `TeacherError` (a ValueError, so start-up turns it into a config error)
before a tokenizer is trained or a weight is made.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from agentrl.data.chat import Message
from agentrl.utils.registry import import_user_module, raised_at_import
from agentrl.utils.tracebacks import describe

TaskMaker = Callable[[int, int, str], list[dict[str, Any]]]  # (n, seed, split) -> tasks
# (task, rng, optimal_prob[, max_turns=]): max_turns is passed only when model.default.demo_max_turns is set
Demonstration = Callable[..., list[Message]]

# A task of the user's own that does not name its strength: half of the teacher's moves are its best.
# At 0.3 (the built-ins' tuned value) a newcomer's task with several right answers per turn stalled its
# warm start at loss 1.48, started at 0.104 held-out and gained +0.010 in 60 RL steps; at 0.5 it started
# at 0.635 and gained +0.328 in 250.
USER_OPTIMAL_PROB = 0.5


class TeacherError(ValueError):
    """The teacher's code failed or gave something that is not a demonstration: one line, with where."""


def module_name(task: str) -> str:
    return task if "." in task else f"envs.{task}"


def _load(task: str) -> ModuleType:
    if not task.endswith(".py"):
        return import_user_module(module_name(task))
    path = Path(task).resolve()
    if not path.is_file():
        raise TeacherError(f"model.default.task={task!r}: no such file ({path})")
    try:
        dotted = ".".join(path.relative_to(Path.cwd()).with_suffix("").parts)
    except ValueError:  # outside the working folder: a module of its own, named after the file's path
        dotted = ""
    if dotted and all(part.isidentifier() for part in dotted.split(".")) and _finds(dotted, path):
        return import_user_module(dotted)
    name = "agentrl_task_" + hashlib.sha256(str(path).encode()).hexdigest()[:8] + "_" + path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses and pickle look the module up by name
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[name]
            raise ValueError(raised_at_import(exc)) from None
    return sys.modules[name]


def _finds(dotted: str, path: Path) -> bool:
    """Whether importing `dotted` gives the file `path` (the folder it lies in is on the import path)."""
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve() == path


def task_module(task: str) -> ModuleType:
    """The module of `model.default.task`; its import failure (a SyntaxError, anything it raises) as one
    line naming file:line."""
    try:
        return _load(task)
    except TeacherError:
        raise
    except ModuleNotFoundError as exc:
        raise TeacherError(f"model.default.task={task!r}: cannot import {exc.name!r} (a module path, dotted, "
                           "importable from the folder the command runs in, or a .py file)") from None
    except ValueError as exc:  # raised while the module ran (import_user_module's one line)
        raise TeacherError(f"model.default.task={task!r}: {exc}") from None


def demo_source(task: str, demo_max_turns: int | None = None) -> tuple[TaskMaker, Demonstration]:
    """The warm-start task's generator and teacher: `demo_tasks` and `demonstration` of the module `task`
    names. A `demo_max_turns` the teacher cannot honour is refused here, with the task's other errors."""
    module = task_module(task)
    missing = [f for f in ("demo_tasks", "demonstration") if not callable(getattr(module, f, None))]
    if missing:
        raise TeacherError(f"model.default.task={task!r}: module {module.__name__} has no {' or '.join(missing)} "
                           "(the warm start's task generator and teacher)")
    if demo_max_turns is not None and "max_turns" not in inspect.signature(module.demonstration).parameters:
        raise TeacherError(f"model.default.demo_max_turns={demo_max_turns}: {task}'s demonstration(task, rng, "
                           "optimal_prob) takes no max_turns; leave demo_max_turns unset for this task")
    return module.demo_tasks, module.demonstration


def optimal_prob(task: str, configured: float | None) -> float:
    """`model.default.demo_optimal_prob`, or when unset the task's own: its module's DEMO_OPTIMAL_PROB
    (the built-ins: 0.3, what their RL gains were measured at), else USER_OPTIMAL_PROB."""
    if configured is not None:
        return configured
    return float(getattr(task_module(task), "DEMO_OPTIMAL_PROB", USER_OPTIMAL_PROB))


def teacher_digest(task: str) -> str:
    """A hash of the files that define `demo_tasks` and `demonstration`: editing the teacher builds the
    model again (code they import from other files is not in it: the docs say so)."""
    digest = hashlib.sha256()
    for name in sorted({inspect.getsourcefile(f) or "" for f in demo_source(task)}):
        digest.update(Path(name).read_bytes() if name and os.path.isfile(name) else name.encode())
    return digest.hexdigest()[:12]


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") in ("system", "user", "assistant", "tool") and "content" in m


def try_teacher(task: str, seed: int, prob: float, demo_max_turns: int | None = None, n: int = 8) -> list[dict]:
    """Run the teacher on `n` demo tasks at strengths `prob`, 0 and 1 (the rng as the warm start seeds it);
    TeacherError with the first failure. The tasks, for a dry run to replay."""
    make_tasks, demonstration = demo_source(task, demo_max_turns)
    turns = {} if demo_max_turns is None else {"max_turns": demo_max_turns}
    try:
        tasks = make_tasks(n, seed, "demo")
    except Exception as exc:  # noqa: BLE001 - the user's code
        raise TeacherError(f"model.default.task={task!r}: demo_tasks({n}, {seed}, 'demo') raised "
                           f"{describe(exc)[0]}") from None
    if not isinstance(tasks, list) or not tasks:
        raise TeacherError(f"model.default.task={task!r}: demo_tasks({n}, {seed}, 'demo') gave "
                           f"{type(tasks).__name__} {str(tasks)[:60]!r}, not a non-empty list of tasks")
    rng = random.Random(seed)
    for strength in (prob, 0.0, 1.0):
        for i, one in enumerate(tasks):
            label = f"demonstration(task {i} {_ident(one)}, rng, optimal_prob={strength})"
            try:
                messages = demonstration(one, rng, strength, **turns)
            except Exception as exc:  # noqa: BLE001 - the user's code
                raise TeacherError(f"model.default.task={task!r}: {label} raised {describe(exc)[0]}") from None
            if not (isinstance(messages, list) and messages and all(_is_message(m) for m in messages)
                    and any(m["role"] == "assistant" for m in messages)):
                raise TeacherError(f"model.default.task={task!r}: {label} gave {str(messages)[:80]!r}: a "
                                   "demonstration is a list of chat messages ({'role', 'content'}) with at "
                                   "least one assistant turn")
    return tasks


def _ident(task: Any) -> str:
    if isinstance(task, dict) and "id" in task:
        return f"id {task['id']!r}"
    return json.dumps(task, default=str)[:60]


def start_verdict(score: float, success_rate: float, default: Any) -> str | None:
    """Why a run on the embedded default should stop after its eval before RL, with what to change, or
    None. `default` is `model.default`; only a model this run warm-started itself is judged."""
    floor = default.min_start_reward
    if floor is None or score >= floor:
        return None
    prob = optimal_prob(default.task, default.demo_optimal_prob)
    return (f"the embedded default, warm-started on {default.task}, scored {score:.3f} held-out before RL (success "
            f"{success_rate:.3f}), below model.default.min_start_reward={floor}: RL from there gives the model too "
            f"little to learn from (a task that started at 0.104 gained +0.010 in 60 steps). Try a stronger teacher "
            f"(model.default.demo_optimal_prob, now {prob}: 0.5-0.7), a longer warm start (model.default.sft_steps, "
            f"now {default.sft_steps}), or a demonstration closer to what the env rewards (python -m agentrl.check "
            f"--policy scripted replays it through the env); model.default.min_start_reward=null trains anyway")


def best_play(task: str, seed: int, n: int, demo_max_turns: int | None = None) -> tuple[list, list[list[str]]]:
    """`n` demo tasks and the teacher's best play on each (optimal_prob 1) as its assistant turns' texts, for
    a dry run to replay through the env: an env that scores its teacher's best play 0 has a teacher (or an
    env) that is wrong, and a warm start on it teaches the model nothing the env rewards."""
    make_tasks, demonstration = demo_source(task, demo_max_turns)
    turns = {} if demo_max_turns is None else {"max_turns": demo_max_turns}
    tasks, rng = try_teacher(task, seed, 1.0, demo_max_turns, n), random.Random(seed)
    return tasks, [[m["content"] for m in demonstration(t, rng, 1.0, **turns) if m["role"] == "assistant"]
                   for t in tasks]


def teaches_the_env(task: str, env_module: str) -> bool:
    """Whether the teacher's demonstrations are of the env being run (the same module), so replaying them
    through the env means something."""
    return task_module(task).__name__ == env_module
