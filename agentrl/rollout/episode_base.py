"""What every episode runner shares: the run's fixed `EpisodeSpec`, the engine protocol, a new
episode's empty ledger and counters, and its finish (trim to the context, close the env or agent).

`rollout.episode` (an Env's turns) and `rollout.agent_episode` (an AgentEnv's `run`) both build on
this; neither imports the other, and `rollout.runner` picks one per run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.data.chat import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.env import Environment
from agentrl.rollout.engine import Generation
from agentrl.types import Episode


class GenerateFn(Protocol):
    """What rollout needs from an engine (the real `Engine`, or a fake in unit tests)."""

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation: ...


class EngineFailure(Exception):
    """The engine failed to produce a turn (as opposed to the Env failing)."""


@dataclass(frozen=True)
class EpisodeSpec:
    """Everything that stays fixed across the episodes of one run (built by `agentrl.run.startup.episode_spec`)."""

    env_cls: type[Environment]
    env_kwargs: dict[str, Any]
    fmt: ChatFormat
    cfg: RolloutConfig
    max_model_len: int
    # AgentEnv runs: the OpenAI endpoint their sessions live on (agent_episode.make_server), and
    # whether reward sources other than the env's own score episodes (then an agent may return None).
    server: Any = None
    scored_by_sources: bool = False

    @property
    def is_agent(self) -> bool:
        """An AgentEnv's run (its `run` drives an OpenAI client on `server`) rather than an Env's (rollout
        drives its turns): the one place the kind of run is read, from `Environment.is_agent`."""
        return bool(self.env_cls.is_agent)


def new_episode(task: dict[str, Any], group_id: int) -> Episode:
    """An empty episode for `task`, with the tool-call counters `record_tool_turn` adds to."""
    return Episode(task_id=str(task.get("id", "")), group_id=group_id,
                   info={"task": task, "tool_calls": 0, "tool_parse_errors": 0, "tool_call_turns": 0})


async def finish_episode(ep: Episode, env: Any, spec: EpisodeSpec) -> None:
    """Trim the ledger to the context and close the env (or agent) under the turn deadline; a failing
    close() is recorded in `info` but keeps the episode's result."""
    trim_to_context(ep, spec.max_model_len)
    if env is not None:
        try:
            await asyncio.wait_for(env.close(), spec.cfg.turn_timeout_s)
        except Exception as exc:
            ep.info["close_error"] = repr(exc)


def trim_to_context(ep: Episode, max_len: int) -> None:
    """Drop trailing env tokens past the context length (only unmasked env text can be there, since
    each generation budget is capped by it); they carry nothing to train on."""
    if len(ep.tokens) > max_len:
        for seq in (ep.tokens, ep.loss_mask, ep.logprobs, ep.versions):
            del seq[max_len:]
