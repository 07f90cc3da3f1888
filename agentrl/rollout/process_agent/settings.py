"""`env.kwargs` of a ProcessAgentEnv, checked once into a typed record.

Every mistake is a ConfigError naming its key (`env.kwargs.command`, ...), raised by `prestart` before
any engine starts, so a run never spawns a single episode from a command it cannot run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.config import ConfigError

# What a command line may name; each is replaced per episode (process_agent.env.ProcessAgentEnv.run).
TEMPLATES = ("task_file", "workdir", "reward_file", "python", "run_cwd")
STDIN_MODES = ("json", "none")
REWARD_MODES = ("process", "sources")
# The episode's own variables (process_agent.env.child_env): set per episode, never by configuration.
RESERVED = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "AGENTRL_TASK_FILE",
            "AGENTRL_REWARD_FILE", "AGENTRL_WORKDIR")


@dataclass(frozen=True)
class ProcessAgentSettings:
    """One run's way of starting its agent program (the docstring of agentrl.rollout.process_agent)."""

    command: tuple[str, ...]  # argv; its items may hold the {TEMPLATES}
    stdin: Literal["json", "none"] = "json"  # json: the task as one JSON object on stdin, then EOF
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables (templates allowed)
    reward: Literal["process", "sources"] = "process"  # process: {reward_file}; sources: rewards.sources
    sandbox: bool = False  # bubblewrap, no network but the episode's own session
    output_bytes: int = 8192  # the tail of stdout and of stderr kept for an error report
    run_cwd: str = ""  # the directory the run started in ({run_cwd}), fixed when the settings are read


def _fail(key: str, what: str) -> ConfigError:
    return ConfigError(f"env.kwargs.{key}: {what}")


def _check_template(key: str, text: str) -> None:
    """A typo in a template ({task-file}) is a start-up error, not a KeyError in every episode."""
    values = {name: "" for name in TEMPLATES}
    try:
        text.format_map(values)
    except KeyError as exc:
        raise _fail(key, f"{text!r} names the unknown template {{{exc.args[0]}}}; templates: "
                         f"{', '.join('{' + t + '}' for t in TEMPLATES)} (write {{{{ and }}}} for literal braces)")
    except (ValueError, IndexError) as exc:
        raise _fail(key, f"{text!r} is not a valid template ({exc}); write {{{{ and }}}} for literal braces")


def read_settings(kwargs: dict[str, Any]) -> ProcessAgentSettings:
    """The settings in `kwargs` (env.kwargs), or ConfigError naming the first key at fault."""
    known = {"command", "stdin", "env", "reward", "sandbox", "output_bytes"}
    for key in kwargs:
        if key == "tasks_from":
            raise _fail(key, "set it in data.task_kwargs (tasks are made before any env is built), e.g. "
                             "data.task_kwargs.tasks_from: envs.calculator:CalculatorEnv")
        if key not in known:
            raise _fail(key, f"unknown key; keys: {', '.join(sorted(known))}")
    command = kwargs.get("command")
    if isinstance(command, str):
        raise _fail("command", f"is the string {command!r}; give the argv as a list, e.g. "
                               f"{command.split()!r} (no shell runs it)")
    if not isinstance(command, (list, tuple)) or not command or not all(isinstance(a, str) for a in command):
        raise _fail("command", f"must be a non-empty list of strings (the argv), got {command!r}")
    for i, arg in enumerate(command):
        _check_template(f"command[{i}]", arg)
    stdin, reward = kwargs.get("stdin", "json"), kwargs.get("reward", "process")
    if stdin not in STDIN_MODES:
        raise _fail("stdin", f"{stdin!r} is not one of {', '.join(STDIN_MODES)}")
    if reward not in REWARD_MODES:
        raise _fail("reward", f"{reward!r} is not one of {', '.join(REWARD_MODES)}")
    env = kwargs.get("env") or {}
    if not isinstance(env, dict):
        raise _fail("env", f"must be a mapping NAME: value, got {type(env).__name__}")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name:
            raise _fail("env", f"{name!r} is not an environment variable name")
        if name in RESERVED:
            raise _fail(f"env.{name}", "is set for each episode to its own session and files; it cannot be configured")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise _fail(f"env.{name}", f"must be a string or a number, got {value!r}")
        _check_template(f"env.{name}", str(value))
    sandbox = kwargs.get("sandbox", False)
    if not isinstance(sandbox, bool):
        raise _fail("sandbox", f"must be true or false, got {sandbox!r}")
    output_bytes = kwargs.get("output_bytes", 8192)
    if isinstance(output_bytes, bool) or not isinstance(output_bytes, int) or not 256 <= output_bytes <= 1 << 20:
        raise _fail("output_bytes", f"must be a whole number of bytes in [256, 1048576], got {output_bytes!r}")
    return ProcessAgentSettings(tuple(command), stdin, {k: str(v) for k, v in env.items()}, reward, sandbox,
                                output_bytes, str(Path.cwd()))


def template_values(workdir: Path, settings: ProcessAgentSettings) -> dict[str, str]:
    """What each template stands for in one episode (files named in agentrl.rollout.process_agent)."""
    return {"task_file": str(workdir / "task.json"), "workdir": str(workdir),
            "reward_file": str(workdir / "reward.json"), "python": sys.executable, "run_cwd": settings.run_cwd}
