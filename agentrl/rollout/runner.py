"""Which episode runner a run uses, chosen once from the env class: an `Env`'s turns are driven by
`rollout.episode.run_episode`, an `AgentEnv`'s `run(client, task)` by
`rollout.agent_episode.run_agent_episode`. Both take (task, engine, spec, group_id, seed) and never
raise for the env's or the engine's failures."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from agentrl.rollout.agent_episode import run_agent_episode
from agentrl.rollout.episode import run_episode
from agentrl.types import Episode

EpisodeRunner = Callable[..., Awaitable[Episode]]


def episode_runner(spec: Any) -> EpisodeRunner:
    """The runner of `spec`'s kind of run (`EpisodeSpec.is_agent`)."""
    return run_agent_episode if spec.is_agent else run_episode
