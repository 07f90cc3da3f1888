"""The Env contract users implement, and loading envs by import path.

One Env instance serves exactly one episode:

    obs = await env.reset(task)                 # chat messages (or a plain string = one user message)
    while not done:
        result = await env.step(Action(text, tool_calls))
        # result.observation: messages to show the model next (ignored when done)
    await env.close()

Exceptions and timeouts raised by an Env end only its own episode (status "env_error" / "timeout").

Agent code written against an OpenAI client is an `AgentEnv` instead: its `run(client, task)` gets an
`openai.AsyncOpenAI` pointed at the episode's own session of the OpenAI endpoint
(agentrl.rollout.openai_server), and returns the reward. A plain `async def run(client, task)`
function named as `env.import_path` is wrapped into one.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, Union

# ToolCall and the default (Hermes) parser live in agentrl.rollout.tools; re-exported here for existing imports.
from agentrl.rollout.tools import ToolCall  # noqa: F401
from agentrl.rollout.tools.hermes import parse as parse_tool_calls  # noqa: F401
from agentrl.utils.registry import import_user_module

Message = dict[str, Any]  # {"role": "user" | "tool" | "system" | "assistant", "content": str, ...}
Observation = Union[str, list[Message]]


@dataclass
class Action:
    """What the model did in one turn: its decoded text and the tool calls parsed from it."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_parse_error: str | None = None  # set when the turn had a malformed tool call


@dataclass
class StepResult:
    observation: Observation | None = None  # next messages for the model; None or [] when done
    reward: float = 0.0  # summed over the episode's steps into Episode.reward
    done: bool = False
    # "success": bool feeds the success-rate metric, "tool_success": bool the tool-call success rate;
    # rollout keeps the latest value of every key in Episode.info["env"].
    info: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """What every environment shares, whichever way its episodes run: one instance per episode,
    `close()` after it, an optional built-in task generator. `Env` (reset/step: rollout drives the
    turns) and `AgentEnv` (run: the agent drives an OpenAI client) are its two kinds; the rollout pool
    picks the episode runner once, from `is_agent`."""

    is_agent: bool = False

    async def close(self) -> None:
        """Release per-episode resources. Called once, also after errors."""

    @classmethod
    def prestart(cls, **kwargs: Any) -> None:
        """Called once when a run starts, with `env.kwargs`, before the engines start: begin the slow
        set-up every episode shares (a server to launch) in the background and return at once. Its
        time then overlaps the engines' start instead of counting against the first episodes'
        deadlines (`rollout.turn_timeout_s`). The default does nothing."""

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        """Built-in task generator for envs that synthesise their own tasks (used when no dataset path is set)."""
        raise NotImplementedError(f"{cls.__name__} has no built-in task generator; set data.train_path")


class Env(Environment):
    """Base class for environments. Subclasses set `tools` (OpenAI function specs) if they have any."""

    tools: list[dict[str, Any]] = []

    @abstractmethod
    async def reset(self, task: dict[str, Any]) -> Observation:
        """Start the episode for `task` and return the first observation."""

    @abstractmethod
    async def step(self, action: Action) -> StepResult:
        """Apply the model's turn and return what happens next."""


class AgentEnv(Environment):
    """An episode is one call of `run`, with a client whose every request the episode's ledger records.

    `run` returns the reward: a number, or a dict {"reward": float, "success": bool, ...} whose other
    keys go to `Episode.info["env"]` (e.g. "tool_success"). Return None only when reward sources
    (`rewards.sources`) score the conversation; with the env's reward as the only source, None is an
    error, never a 0. Exceptions and timeouts end only this episode, as for an Env. One instance serves
    one episode; `close()` runs after it.
    """

    is_agent = True
    tools: list[dict[str, Any]] = []  # the agent sends its tools with each request; none are declared up front
    # The client `run` is given, both on the episode's session: "openai" (`openai.AsyncOpenAI`) or
    # "anthropic" (`anthropic.AsyncAnthropic`, served by the endpoint's /v1/messages).
    api: Literal["openai", "anthropic"] = "openai"

    @abstractmethod
    async def run(self, client: Any, task: dict[str, Any]) -> float | dict[str, Any] | None:
        """Play the task with `client` (an `openai.AsyncOpenAI`, or an `anthropic.AsyncAnthropic` when
        `api = "anthropic"`); return its reward."""


def agent_from_function(fn: Any, name: str) -> type[AgentEnv]:
    """An AgentEnv class whose `run` is the coroutine function `fn(client, task)`."""

    async def run(self, client: Any, task: dict[str, Any]) -> Any:
        return await fn(client, task)

    return type(name, (AgentEnv,), {"run": run, "__module__": fn.__module__, "__doc__": fn.__doc__})


def to_messages(obs: Observation | None) -> list[Message]:
    if obs is None:
        return []
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    return list(obs)


def load_env(import_path: str) -> type[Environment]:
    """Resolve `package.module:ClassName` to an Env or AgentEnv subclass, with errors that say what is wrong."""
    if ":" not in import_path:
        raise ValueError(f"env import path {import_path!r} must look like 'package.module:ClassName'")
    module_name, _, attr = import_path.partition(":")
    try:
        module = import_user_module(module_name)  # a failure inside the module: a ValueError naming file:line
    except ImportError as exc:
        raise ValueError(f"cannot import env module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if cls is None:
        names = [n for n in dir(module) if isinstance(getattr(module, n), type)]
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}; classes there: {names}")
    if inspect.iscoroutinefunction(cls):
        return agent_from_function(cls, attr)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"{import_path!r} is not a subclass of agentrl.env.Env or agentrl.env.AgentEnv (nor an "
                         "async agent function run(client, task))")
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        raise ValueError(f"{import_path!r} is abstract: implement {missing}")
    return cls
