"""One AgentEnv episode: the agent's own OpenAI-client code, recorded by its session's ledger.

`run_agent_episode` opens a session of the run's OpenAI endpoint on the episode's engine, gives the
agent an `openai.AsyncOpenAI` (or, for an agent whose `api` is "anthropic", an `anthropic.AsyncAnthropic`)
whose base URL is that session, awaits `agent.run(client, task)` on
this event loop under the episode deadline, and turns what it returns into the reward. The Episode
the session filled is the training data, one row per ledger segment.

Statuses, as for an Env: the engine failing a request -> engine_error (even when the agent caught the
error); a generation or the episode over its deadline -> timeout; the context or turn limit
reached -> truncated (the agent's own doing, trained with the reward it returns, 0 if it raised);
anything else the agent raises, or a return value that is no reward -> env_error.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from agentrl.rollout.episode_base import finish_episode, new_episode
from agentrl.rollout.session import Limits
from agentrl.utils.tracebacks import describe
from agentrl.types import Episode

NO_REQUEST = "the agent returned without making a request"


def make_server(spec: Any, engine: Any, server_cfg: Any) -> Any:
    """The endpoint for `spec`'s agent episodes (not yet started); `engine` serves out-of-session requests.
    Without a configured `server.api_key` it requires a token drawn for this run, which only the clients
    it hands its agents carry (`client.api_key`): no other program on the machine can generate with the
    model, or write into an episode's ledger."""
    from agentrl.config.secrets import drawn_secret
    from agentrl.rollout.openai_server import OpenAIServer
    from agentrl.rollout.tools import get_tool_format

    if server_cfg.api_key is None:
        server_cfg = server_cfg.model_copy(update={"api_key": drawn_secret()})
    cfg = spec.cfg
    limits = Limits(spec.max_model_len, cfg.max_tokens_per_turn, cfg.max_turns, cfg.temperature, cfg.top_p,
                    cfg.turn_timeout_s)
    return OpenAIServer(spec.fmt, server_cfg, get_tool_format(cfg.tool_format), limits, engine)


def _take_result(ep: Episode, result: Any) -> None:
    """The agent's return value as the episode's reward; ValueError if it is none."""
    info: dict[str, Any] = {}
    if isinstance(result, dict):
        if "reward" not in result:
            raise ValueError(f"the agent returned a dict without 'reward' (keys {sorted(result)})")
        info = {k: v for k, v in result.items() if k != "reward"}
        result = result["reward"]
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
        raise ValueError(f"the agent returned {result!r}; return a finite number or {{'reward': ..., ...}}")
    ep.reward = float(result)
    ep.success = bool(info.get("success", False))
    ep.info.setdefault("env", {}).update(info)


async def run_agent_episode(task: dict[str, Any], engine: Any, spec: Any, group_id: int = 0,
                            seed: int | None = None) -> Episode:
    """Play one AgentEnv episode. Never raises for agent or engine failures: they set `status`/`error`."""
    ep = new_episode(task, group_id)
    server = spec.server
    session = server.open_session(engine, ep)
    session.seed = seed
    agent = None
    try:
        make = server.anthropic_client if getattr(spec.env_cls, "api", "openai") == "anthropic" else server.client
        client = make(session.base_url, spec.cfg.turn_timeout_s + 5.0)
        async with asyncio.timeout(spec.cfg.episode_timeout_s):
            agent = spec.env_cls(**spec.env_kwargs)
            result = await agent.run(client, task)
        if not session.requests:  # before the reward: an episode that never ran is no reward's
            raise ValueError(NO_REQUEST)
        if result is None and spec.scored_by_sources:
            ep.info.setdefault("env", {})
        else:
            _take_result(ep, result)
        _set_status(ep, session, None)
    except TimeoutError:
        ep.status, ep.error = "timeout", "episode deadline exceeded"
    except Exception as exc:  # the agent's code: isolated from the run
        _set_status(ep, session, exc)
    finally:
        server.close_session(session.sid)
        await finish_episode(ep, agent, spec)
    return ep


def _set_status(ep: Episode, session: Any, exc: BaseException | None) -> None:
    if session.engine_error or session.timed_out:  # what the agent returned is not the episode's outcome
        ep.reward, ep.success = 0.0, False
    if session.engine_error:
        ep.status, ep.error = "engine_error", session.engine_error
    elif session.timed_out:
        ep.status, ep.error = "timeout", "a generation exceeded rollout.turn_timeout_s"
    elif session.truncated:
        ep.status = "truncated"
    elif exc is not None:
        ep.status = "env_error"
        ep.error, ep.traceback = describe(exc)
        if not session.requests and str(exc) != NO_REQUEST:  # failed before its first request: say so too
            ep.error += " (it never called the model)"
