"""One Env episode against the engine: `run_episode` drives the turns and builds the token ledger
(`Episode.append`). AgentEnv episodes run in `rollout.agent_episode`; `rollout.runner` picks.

Nothing here knows about DeepSpeed. Failures of user code (Env) and of the engine end only their
own episode with a recorded status; cancellation (shutdown) still propagates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agentrl.env import Action, Env, to_messages
from agentrl.rollout.episode_base import EpisodeSpec  # noqa: F401 (re-exported: where users build one)
from agentrl.rollout.episode_base import EngineFailure, GenerateFn, finish_episode, new_episode
from agentrl.rollout.tools.counts import record_tool_turn
from agentrl.rollout.tools import get_tool_parser
from agentrl.utils.tracebacks import describe
from agentrl.types import Episode, Turn

log = logging.getLogger(__name__)


async def _generate(engine: GenerateFn, ep: Episode, spec: EpisodeSpec, budget: int, seed: int | None):
    try:
        return await asyncio.wait_for(
            engine.generate(ep.tokens, budget, spec.cfg.temperature, spec.cfg.top_p, seed), spec.cfg.turn_timeout_s)
    except TimeoutError:
        raise
    except Exception as exc:  # vLLM errors, dead engine process, ...
        raise EngineFailure(f"{type(exc).__name__}: {exc}") from exc


async def _play(env: Env, task: dict[str, Any], engine: GenerateFn, spec: EpisodeSpec, ep: Episode,
                seed: int | None) -> None:
    cfg, fmt = spec.cfg, spec.fmt
    messages = to_messages(await asyncio.wait_for(env.reset(task), cfg.turn_timeout_s))
    ep.messages = list(messages)
    prompt = fmt.initial(messages, tools=env.tools or None)
    ep.append(prompt, generated=False)
    ep.prompt_len = len(prompt)
    for turn_idx in range(cfg.max_turns):
        budget = min(cfg.max_tokens_per_turn, spec.max_model_len - len(ep.tokens))
        if budget <= 0:
            ep.status = "truncated"
            return
        turn_seed = None if seed is None else seed * 1000 + turn_idx
        gen = await _generate(engine, ep, spec, budget, turn_seed)
        start = len(ep.tokens)
        ep.append(gen.token_ids, generated=True, logprobs=gen.logprobs, versions=gen.versions)
        ended = bool(gen.token_ids) and gen.token_ids[-1] == fmt.eos_id
        text = fmt.tokenizer.decode(gen.token_ids[:-1] if ended else gen.token_ids)
        calls, parse_error = get_tool_parser(cfg.tool_format)(text)
        record_tool_turn(ep.info, calls, parse_error)
        ep.messages.append({"role": "assistant", "content": text})
        ep.turns.append(Turn(start=start, n_generated=len(gen.token_ids), text=text))
        t_env = time.perf_counter()
        result = await asyncio.wait_for(env.step(Action(text, calls, parse_error)), cfg.turn_timeout_s)
        ep.turns[-1].env_s = time.perf_counter() - t_env
        ep.reward += float(result.reward)
        ep.success = bool(result.info.get("success", ep.success))
        ep.info.setdefault("env", {}).update(result.info)  # the latest value of each key the env reported
        if result.done:
            return
        new_messages = to_messages(result.observation)
        closing = [] if ended else [fmt.eos_id]  # close a turn cut at max_tokens so the template lines up
        suffix = closing + fmt.continuation(new_messages)
        ep.append(suffix, generated=False)
        ep.turns[-1].env_tokens = len(suffix)
        ep.messages += new_messages
    ep.status = "truncated"


async def run_episode(task: dict[str, Any], engine: GenerateFn, spec: EpisodeSpec, group_id: int = 0,
                      seed: int | None = None) -> Episode:
    """Play one Env episode. Never raises for Env or engine failures: they set `status` and `error`."""
    ep = new_episode(task, group_id)
    env: Env | None = None
    try:
        async with asyncio.timeout(spec.cfg.episode_timeout_s):
            env = spec.env_cls(**spec.env_kwargs)
            await _play(env, task, engine, spec, ep, seed)
    except TimeoutError:
        ep.status, ep.error = "timeout", "episode or turn deadline exceeded"
    except EngineFailure as exc:
        ep.status, ep.error = "engine_error", str(exc)
    except Exception as exc:  # user Env code: isolate it from the run
        ep.status = "env_error"
        ep.error, ep.traceback = describe(exc)
    finally:
        await finish_episode(ep, env, spec)
    return ep
