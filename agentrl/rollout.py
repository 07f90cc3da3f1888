"""Episodes against the engine: `run_episode` builds one token ledger; `RolloutPool` runs many at once.

Nothing here knows about DeepSpeed. Failures of user code (Env) and of the engine end only their
own episode with a recorded status; cancellation (shutdown) still propagates.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.chat import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.engine import Generation
from agentrl.env import Action, Env, to_messages
from agentrl.tools import ToolCallStats, get_tool_parser, record_tool_turn
from agentrl.types import TRAINABLE_STATUSES, Episode, Group, Turn

log = logging.getLogger(__name__)


class GenerateFn(Protocol):
    """What rollout needs from an engine (the real `Engine`, or a fake in unit tests)."""

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation: ...


class Scorer(Protocol):
    """Sets a finished episode's reward (or marks it "reward_error"); rewards.sources.RewardCombiner."""

    async def score(self, episode: Episode) -> None: ...


class EngineFailure(Exception):
    """The engine failed to produce a turn (as opposed to the Env failing)."""


@dataclass
class EpisodeSpec:
    """Everything that stays fixed across the episodes of one run."""

    env_cls: type[Env]
    env_kwargs: dict[str, Any]
    fmt: ChatFormat
    cfg: RolloutConfig
    max_model_len: int


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
        calls, parse_error = get_tool_parser(cfg.tool_parser)(text)
        record_tool_turn(ep.info, calls, parse_error)
        ep.messages.append({"role": "assistant", "content": text})
        ep.turns.append(Turn(start=start, n_generated=len(gen.token_ids), text=text))
        result = await asyncio.wait_for(env.step(Action(text, calls, parse_error)), cfg.turn_timeout_s)
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


def _trim_to_context(ep: Episode, max_len: int) -> None:
    """Drop trailing env tokens past the context length (only unmasked env text can be there, since
    each generation budget is capped by it); they carry nothing to train on."""
    if len(ep.tokens) > max_len:
        for seq in (ep.tokens, ep.loss_mask, ep.logprobs, ep.versions):
            del seq[max_len:]


async def run_episode(task: dict[str, Any], engine: GenerateFn, spec: EpisodeSpec, group_id: int = 0,
                      seed: int | None = None) -> Episode:
    """Play one episode. Never raises for Env or engine failures: they set `status` and `error`."""
    ep = Episode(task_id=str(task.get("id", "")), group_id=group_id,
                 info={"task": task, "tool_calls": 0, "tool_parse_errors": 0, "tool_call_turns": 0})
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
        ep.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    finally:
        _trim_to_context(ep, spec.max_model_len)
        if env is not None:
            try:
                await asyncio.wait_for(env.close(), spec.cfg.turn_timeout_s)
            except Exception as exc:  # a failing close() is recorded but keeps the episode's result
                ep.info["close_error"] = repr(exc)
    return ep


class RolloutPool:
    """Runs episodes concurrently on the current event loop under a concurrency cap, and counts them."""

    def __init__(self, engine: GenerateFn, spec: EpisodeSpec, scorer: Scorer | None = None) -> None:
        self.engine, self.spec, self.scorer = engine, spec, scorer
        self._sem = asyncio.Semaphore(spec.cfg.max_concurrency)
        self.in_flight = 0
        self.status_counts: Counter[str] = Counter()
        self.generated_tokens = 0
        self.tool_stats = ToolCallStats()  # tool_calls, tool_parse_errors, turns, episodes_without_tool_call
        self.started = time.perf_counter()

    async def episode(self, task: dict[str, Any], group_id: int, seed: int | None = None) -> Episode:
        async with self._sem:
            self.in_flight += 1
            try:
                ep = await run_episode(task, self.engine, self.spec, group_id, seed)
            finally:
                self.in_flight -= 1
        if self.scorer is not None and ep.status in TRAINABLE_STATUSES:
            await self.scorer.score(ep)  # outside the episode cap: sources have caps of their own
        self.status_counts[ep.status] += 1
        self.generated_tokens += ep.n_generated
        self.tool_stats.add_episode(ep)
        if ep.status not in TRAINABLE_STATUSES:
            log.warning("episode %s ended with %s: %s", ep.task_id, ep.status, ep.error)
        return ep

    async def group(self, task: dict[str, Any], group_id: int, n: int, issued_version: int = 0) -> Group:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self.episode(task, group_id)) for _ in range(n)]
        return Group(group_id=group_id, task=task, episodes=[t.result() for t in tasks],
                     issued_version=issued_version)

    async def evaluate(self, tasks: list[dict[str, Any]], seed: int) -> list[Episode]:
        """One episode per task, with per-task sampling seeds so a re-run sees the same randomness."""
        async with asyncio.TaskGroup() as tg:
            jobs = [tg.create_task(self.episode(t, -1 - i, seed=seed * 100_003 + i)) for i, t in enumerate(tasks)]
        return [j.result() for j in jobs]
