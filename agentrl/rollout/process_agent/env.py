"""ProcessAgentEnv: an AgentEnv whose `run` starts the configured program and scores what it did.

The contract for a program author is agentrl.rollout.process_agent's docstring; this file keeps it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError
from agentrl.env import AgentEnv, load_env
from agentrl.rollout.process_agent.child import ChildResult, ProcessAgentError, exit_error, run_child
from agentrl.rollout.process_agent.reward_file import read_reward
from agentrl.rollout.process_agent.sandbox import SessionProxy, bwrap_path, sandbox_argv, sandbox_urls
from agentrl.rollout.process_agent.settings import ProcessAgentSettings, read_settings, template_values
from agentrl.rollout.process_agent.workdir import new_episode_dir, remove_episode_dir

# The parent's variables a program gets; nothing else of the trainer's environment (its keys and
# tokens, cloud credentials) reaches it. `env.kwargs.env` adds more.
PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")


def child_env(settings: ProcessAgentSettings, base_url: str, api_key: str, values: dict[str, str]) -> dict[str, str]:
    """The program's whole environment: PASSED_THROUGH, `env.kwargs.env` (templates expanded), then the
    episode's own variables, which the configured ones cannot shadow (settings.RESERVED)."""
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.update({k: v.format_map(values) for k, v in settings.env.items()})
    # The Anthropic SDK appends /v1/messages to its base URL; the session serves it under the same /v1.
    anthropic_url = base_url[:-len("/v1")] if base_url.endswith("/v1") else base_url
    env.update({"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "ANTHROPIC_BASE_URL": anthropic_url,
                "ANTHROPIC_API_KEY": api_key, "AGENTRL_TASK_FILE": values["task_file"],
                "AGENTRL_REWARD_FILE": values["reward_file"], "AGENTRL_WORKDIR": values["workdir"]})
    return env


def _read_timeout(client: Any) -> float:
    """The client's per-request read timeout (rollout.turn_timeout_s + 5 s), for the sandbox's proxy."""
    timeout = client.timeout
    return float(timeout) if isinstance(timeout, (int, float)) else float(getattr(timeout, "read", None) or 600.0)


class ProcessAgentEnv(AgentEnv):
    """One episode = one run of `env.kwargs.command` against the episode's session (see the package
    docstring for the keys, the environment, the reward file and the statuses)."""

    def __init__(self, **kwargs: Any) -> None:
        self.settings = read_settings(kwargs)
        self.last_child: ChildResult | None = None  # how the process ended (bench/process_agent.py reads it)

    @classmethod
    def prestart(cls, **kwargs: Any) -> None:
        """Checks env.kwargs (and that bwrap is there when sandboxed) before any engine starts."""
        if read_settings(kwargs).sandbox:
            bwrap_path()

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, tasks_from: str | None = None,
                   **kwargs: Any) -> list[dict[str, Any]]:
        """Tasks of the env named by `data.task_kwargs.tasks_from` (its make_tasks gets the other keys)."""
        if tasks_from is None:
            raise NotImplementedError("ProcessAgentEnv makes no tasks of its own; set data.train_path and "
                                      "data.eval_path, or data.task_kwargs.tasks_from: package.module:EnvClass")
        try:
            source = load_env(tasks_from)
        except ValueError as exc:
            raise ConfigError(f"data.task_kwargs.tasks_from: {exc}") from None
        return source.make_tasks(n, seed, split, **kwargs)

    async def run(self, client: Any, task: dict[str, Any]) -> dict[str, Any] | None:
        settings = self.settings
        base_url, api_key = str(client.base_url).rstrip("/"), str(client.api_key)
        episode = new_episode_dir()
        try:
            workdir = episode / "work"
            values = template_values(workdir, settings)
            task_json = json.dumps(task).encode()
            Path(values["task_file"]).write_bytes(task_json)
            argv = [arg.format_map(values) for arg in settings.command]
            stdin = task_json + b"\n" if settings.stdin == "json" else None
            if settings.sandbox:
                inside_url, origin, prefix = sandbox_urls(base_url)
                env = {**child_env(settings, inside_url, api_key, values), "HOME": str(workdir)}
                argv = sandbox_argv(argv, episode, episode / "api.sock", os.environ.get("HOME"))
                async with SessionProxy(episode / "api.sock", origin, prefix, _read_timeout(client)):
                    result = await self._start(argv, env, workdir, stdin)
            else:
                result = await self._start(argv, child_env(settings, base_url, api_key, values), workdir, stdin)
            self.last_child = result
            error = exit_error(result, 128 if settings.sandbox else 0)
            if error is not None:
                raise error from result.output()
            if settings.reward == "sources":
                return None
            try:
                return read_reward(Path(values["reward_file"]))
            except ProcessAgentError as exc:
                raise exc from result.output()
        finally:
            remove_episode_dir(episode)

    async def _start(self, argv: list[str], env: dict[str, str], workdir: Path, stdin: bytes | None) -> ChildResult:
        try:
            return await run_child(argv, env, workdir, stdin, self.settings.output_bytes)
        except OSError as exc:  # no such file, not executable: the command's fault, said as such
            raise ProcessAgentError(f"cannot start the agent process {argv[0]!r}: {exc.strerror or exc} "
                                    "(env.kwargs.command; relative paths are from its working directory, "
                                    "{run_cwd} names the run's)") from None
