"""Several reward sources per run, combined with weights: the env's own reward, rule functions, HTTP
verifiers, reward-model scorers and process reward models.

    episode.reward = sum_i weight_i * value_i

Each source's value and status is kept in `episode.info["rewards"][name]` and counted per source.
A source that fails (status "error" / "timeout") is re-asked up to `max_retries` times when
`on_failure: retry`; if it still fails, the episode gets status "reward_error": it is dropped from
training and counted, never scored 0.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config import EnvSource, HttpSource, RewardModelSource, RewardsConfig, RewardSourceConfig, RuleSource
from agentrl.config.sources import PRMSource
from agentrl.types import Episode
from agentrl.utils.registry import import_user_module
from rewards.base import RewardFn, RewardResult
from rewards.reward_model import EngineFactory


async def env_reward(episode: Episode) -> RewardResult:
    """The sum of the env's step rewards (what rollout recorded before any other source ran)."""
    return RewardResult(float(episode.info.get("env_reward", episode.reward)))


def import_rule(path: str, key: str) -> Any:
    """The function at 'package.module:function'; a ValueError naming `key` if it cannot be had."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"{key}={path!r} must look like 'package.module:function'")
    try:
        fn = getattr(import_user_module(module), attr, None)
    except ImportError as exc:
        raise ValueError(f"{key}={path!r}: cannot import {module!r} ({exc})") from None
    except ValueError as exc:  # the module failed while it ran: file:line of the failure
        raise ValueError(f"{key}={path!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"{key}={path!r}: {module!r} has no function {attr!r}")
    return fn


def check_sources(cfg: RewardsConfig) -> None:
    """What can be checked without building a source: rule imports and reward-model and PRM folders."""
    for i, entry in enumerate(cfg.sources):
        if isinstance(entry, RuleSource):
            import_rule(entry.rule, f"rewards.sources.{i}.rule")
        if isinstance(entry, RewardModelSource) and not Path(entry.reward_model.path).is_dir():
            raise ValueError(f"rewards.sources.{i}.reward_model.path={entry.reward_model.path!r}: no such folder")
        if isinstance(entry, PRMSource) and not Path(entry.prm.path).is_dir():
            raise ValueError(f"rewards.sources.{i}.prm.path={entry.prm.path!r}: no such folder")


def build_source(cfg: RewardSourceConfig, key: str = "rule", engine_factory: EngineFactory | None = None) -> RewardFn:
    """One RewardFn from its config entry (imports happen here, at start-up, so errors surface early).
    `engine_factory` wraps a reward model in a DeepSpeed engine when its config asks for one."""
    if isinstance(cfg, EnvSource):
        return env_reward
    if isinstance(cfg, RuleSource):
        from rewards.rules import as_reward

        return as_reward(import_rule(cfg.rule, key), answer_key=cfg.answer_key)
    if isinstance(cfg, HttpSource):
        from rewards.http_verifier import HttpVerifier

        return HttpVerifier(cfg.http)
    if isinstance(cfg, PRMSource):
        from rewards.prm import PRMScorer

        return PRMScorer(cfg.prm)
    from rewards.reward_model import RewardModelScorer

    return RewardModelScorer(cfg.reward_model, engine_factory)


@dataclass
class SourceStats:
    status: Counter = field(default_factory=Counter)  # results by status, retries included
    retries: int = 0
    value_sum: float = 0.0
    value_n: int = 0


class RewardCombiner:
    """Scores finished episodes with every configured source, concurrently per episode."""

    def __init__(self, cfg: RewardsConfig, engine_factory: EngineFactory | None = None) -> None:
        """`engine_factory`: see `build_source` (the learner's `frozen_engine`, passed in by train.py)."""
        self.cfg = cfg
        entries = cfg.sources or [EnvSource(name="env", type="env")]
        self.sources: list[tuple[RewardSourceConfig, RewardFn]] = [
            (e, build_source(e, f"rewards.sources.{i}.rule", engine_factory)) for i, e in enumerate(entries)]
        self.stats: dict[str, SourceStats] = defaultdict(SourceStats)

    async def _one(self, entry: RewardSourceConfig, fn: RewardFn, episode: Episode) -> RewardResult:
        stats = self.stats[entry.name]
        retries = self.cfg.max_retries if self.cfg.on_failure == "retry" else 0
        for attempt in range(retries + 1):
            result = await fn(episode)
            stats.status[result.status] += 1
            if result.ok and math.isfinite(result.value):
                stats.value_sum += result.value
                stats.value_n += 1
                return result
            if result.ok:  # a finite value is part of "ok"; NaN/inf from a source is its failure
                result = RewardResult(float("nan"), "error", {**result.info, "error": "non-finite reward"})
            if attempt < retries:
                stats.retries += 1
        return result

    async def score(self, episode: Episode) -> None:
        """Set episode.reward from all sources, or mark it "reward_error" if one failed for good."""
        episode.info["env_reward"] = episode.reward
        results = await asyncio.gather(*(self._one(e, fn, episode) for e, fn in self.sources))
        episode.info["rewards"] = {e.name: {"value": r.value, "status": r.status, **(
            {"error": r.info.get("error")} if not r.ok else {})} for (e, _), r in zip(self.sources, results)}
        failed = [(e.name, r) for (e, _), r in zip(self.sources, results) if not r.ok]
        if failed:
            episode.status = "reward_error"
            episode.error = "; ".join(f"{name}: {r.status} ({r.info.get('error', '')})" for name, r in failed)
            episode.traceback = next((r.info["traceback"] for _, r in failed if r.info.get("traceback")), "")
            return
        episode.reward = sum(e.weight * r.value for (e, _), r in zip(self.sources, results))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, s in self.stats.items():
            out[f"reward/{name}/mean"] = s.value_sum / s.value_n if s.value_n else math.nan
            out[f"reward/{name}/retries"] = s.retries
            for status, n in s.status.items():
                out[f"reward/{name}/{status}"] = n
        return out

    async def aclose(self) -> None:
        for _, fn in self.sources:
            close = getattr(fn, "aclose", None)
            if close is not None:
                await close()
