"""Many episodes at once on one event loop: `RolloutPool` (concurrency cap, counters, eval scoring) and
`Producer`, which admits groups through the staleness buffer and runs them on the pool.

Nothing here knows about DeepSpeed or the learner.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from agentrl.utils import faults
from agentrl.algo import informative_groups
from agentrl.run.buffer import BufferClosed, StalenessBuffer
from agentrl.telemetry.learning_signal import WHAT_TO_DO, NoLearningSignal, filter_streak_cause
from agentrl.rollout.episode_base import EpisodeSpec, GenerateFn
from agentrl.rollout.failures import FailureWatch
from agentrl.rollout.failing import FailOnce, unless_failed
from agentrl.rollout.runner import episode_runner
from agentrl.rollout.tools.counts import ToolCallStats
from agentrl.types import TRAINABLE_STATUSES, Episode, Group

log = logging.getLogger(__name__)


class Scorer(Protocol):
    """Sets a finished episode's reward (or marks it "reward_error"); rewards.sources.RewardCombiner."""

    async def score(self, episode: Episode) -> None: ...


class RolloutPool:
    """Runs episodes concurrently on the current event loop under a concurrency cap, and counts them.

    Failed episodes go to `failures` (agentrl.rollout.failures): aggregated logs, and `failed`, a
    future that gets `EpisodesFailing` once failures persist; whoever drives the pool awaits it
    beside its own work (`evaluate` does)."""

    def __init__(self, engine: GenerateFn, spec: EpisodeSpec, scorer: Scorer | None = None,
                 teacher: Scorer | None = None) -> None:
        # teacher: scores training episodes' tokens (algo.teacher placement engine, agentrl.rollout.teacher)
        self.engine, self.spec, self.scorer, self.teacher = engine, spec, scorer, teacher
        self.run_episode = episode_runner(spec)  # an Env's turns or an AgentEnv's run, fixed for the run
        self._sem = asyncio.Semaphore(spec.cfg.max_concurrency)
        self.in_flight = 0
        self.status_counts: Counter[str] = Counter()
        self.generated_tokens = 0
        self.tool_stats = ToolCallStats()  # tool_calls, tool_parse_errors, turns, episodes_without_tool_call
        self.started = time.perf_counter()
        self.failures = FailureWatch.for_rollout(spec.cfg.fail_after, spec.cfg.max_concurrency)
        self._failed = FailOnce()

    def state_dict(self) -> dict[str, Any]:
        """The counters a resumed run continues (copies: the pool goes on counting)."""
        return copy.deepcopy({"status_counts": self.status_counts, "generated_tokens": self.generated_tokens,
                              "tool_stats": self.tool_stats,
                              "scorer_stats": None if self.scorer is None else self.scorer.stats})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = copy.deepcopy(state)
        self.status_counts, self.generated_tokens = state["status_counts"], state["generated_tokens"]
        self.tool_stats = state["tool_stats"]
        if self.scorer is not None and state["scorer_stats"] is not None:
            self.scorer.stats = state["scorer_stats"]

    def clear_counters(self) -> None:
        """Start counting afresh (after the held-out evaluation before RL)."""
        self.status_counts.clear()
        self.tool_stats.clear()
        if self.scorer is not None:
            self.scorer.stats.clear()

    @property
    def failed(self) -> asyncio.Future:
        """Gets `EpisodesFailing` once failures persist."""
        return self._failed.future

    async def episode(self, task: dict[str, Any], group_id: int, seed: int | None = None,
                      sample: int = 0) -> Episode:
        async with self._sem:
            self.in_flight += 1
            try:
                # A fleet pins the episode to one engine for all its turns (its prefix cache).
                lease = getattr(self.engine, "lease", None)
                async with (lease() if lease else contextlib.nullcontext(self.engine)) as engine:
                    ep = await self.run_episode(task, engine, self.spec, group_id, seed)
                ep.sample = sample
                faults.reached("generation")  # this episode is done; others are mid-generation
            finally:
                self.in_flight -= 1
        if self.scorer is not None and ep.status in TRAINABLE_STATUSES:
            await self.scorer.score(ep)  # outside the episode cap: sources have caps of their own
        if self.teacher is not None and group_id >= 0 and ep.trainable:  # held-out episodes are not trained
            await self._teacher_score(ep)
        self.status_counts[ep.status] += 1
        self.generated_tokens += ep.n_generated
        self.tool_stats.add_episode(ep)
        self.failures.record(ep)
        if self.failures.tripped is not None:
            self._failed.fail(self.failures.tripped)
        return ep

    async def _teacher_score(self, ep: Episode) -> None:
        try:
            await self.teacher.score(ep)
        except Exception as exc:  # an engine failure ends this episode, not the run (dropped and counted)
            ep.status, ep.error = "engine_error", f"teacher engine: {type(exc).__name__}: {exc}"

    async def group(self, task: dict[str, Any], group_id: int, n: int, issued_version: int = 0) -> Group:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self.episode(task, group_id, sample=k)) for k in range(n)]
        return Group(group_id=group_id, task=task, episodes=[t.result() for t in tasks],
                     issued_version=issued_version)

    async def evaluate(self, tasks: list[dict[str, Any]], seed: int) -> list[Episode]:
        """One episode per task, with per-task sampling seeds so a re-run sees the same randomness.
        Raises EpisodesFailing when failures persist (the streak, or every episode failed)."""
        jobs = [asyncio.ensure_future(self.episode(t, -1 - i, seed=seed * 100_003 + i)) for i, t in enumerate(tasks)]
        try:
            episodes = await unless_failed(asyncio.gather(*jobs), self.failed)
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            self.failures.flush("evaluation")
        self.failures.check_evaluation(episodes)
        return episodes


@dataclass
class EvalResult:
    score: float  # mean reward over episodes that finished (ok / truncated)
    success_rate: float
    n: int
    failed: dict[str, int] = field(default_factory=dict)  # infrastructure failures, not scored
    # Share of finished episodes with a tool call the server executed without error (the env's
    # info["tool_success"]); None when the env reports no tool use.
    tool_call_success_rate: float | None = None
    seconds: float | None = None  # the eval's wall time (set by the run that timed it)


def score_episodes(episodes: list[Episode]) -> EvalResult:
    done = [e for e in episodes if e.status in ("ok", "truncated")]
    failed = Counter(e.status for e in episodes if e.status not in ("ok", "truncated"))
    n = max(len(done), 1)
    result = EvalResult(sum(e.reward for e in done) / n, sum(e.success for e in done) / n, len(done), dict(failed))
    if any("tool_success" in e.info.get("env", {}) for e in done):
        result.tool_call_success_rate = sum(bool(e.info["env"].get("tool_success")) for e in done) / n
    return result


class Producer:
    """Admits groups through the buffer and runs them on the pool until stopped.

    Each group is one task of the stream, and its group id is the task's stream position. Positions
    are taken in order from `cursor`, after the `reissue` ones (groups that were in flight when a
    checkpoint was taken). `in_flight()` and `take_outcomes()` let the driver account for every
    position: trained, dropped (with its reason), finished and waiting, or in flight."""

    def __init__(self, buffer: StalenessBuffer, pool: RolloutPool, tasks: Callable[[int], dict], n: int,
                 dynamic_filter: bool = False, filter_limit: int = 0) -> None:
        """`tasks`: position -> task (`agentrl.data.TaskStream`). `dynamic_filter`: groups whose
        trainable episodes all got the same reward carry no group-relative signal; they give their
        slot back and another group is sampled (DAPO). `filter_limit` (0: none): after that many dropped
        in a row, with none kept, `failed` gets NoLearningSignal (sampling on would never fill a batch);
        a warning comes at a quarter of it."""
        self.buffer, self.pool, self.tasks, self.n = buffer, pool, tasks, n
        self.dynamic_filter, self.filter_limit = dynamic_filter, filter_limit
        self.filtered_in_a_row = 0
        self._streak_rewards: set[float] = set()
        self._failed = FailOnce()
        self.cursor = 0  # the next new stream position (load_state_dict: a checkpoint's)
        self._reissue: deque[int] = deque()  # set by load_state_dict
        self.groups_finished = self.groups_filtered = 0
        self._jobs: set[asyncio.Task] = set()
        self._live: set[int] = set()  # positions admitted and not yet put, released or refunded
        self._outcomes: list[tuple[int, str]] = []  # (position, "failed" | "filtered") not yet taken
        # The groups dynamic_filter dropped since the run last took them, for rollouts.jsonl (`take_filtered`);
        # None: not kept (a run that writes no rollouts)
        self.filtered: list[Group] | None = None

    async def run(self) -> None:
        try:
            while True:
                version = await self.buffer.admit()
                if self._reissue:
                    position = self._reissue.popleft()
                else:
                    position, self.cursor = self.cursor, self.cursor + 1
                self._live.add(position)
                job = asyncio.create_task(self._group(self.tasks(position), position, version))
                self._jobs.add(job)
                job.add_done_callback(self._jobs.discard)
        except BufferClosed:
            pass

    async def _group(self, task: dict, position: int, version: int) -> None:
        group = await self.pool.group(task, position, self.n, version)
        if self.buffer.closed:
            return
        self._live.discard(position)
        self.groups_finished += 1
        if self.dynamic_filter and not _informative(group.episodes):
            self.groups_filtered += 1
            self.buffer.release()
            self._outcomes.append((position, "filtered"))
            if self.filtered is not None:
                self.filtered.append(group)
            self._count_filtered(group)
            return
        if not self.buffer.put(group):
            self._outcomes.append((position, "failed"))
        elif self.filtered_in_a_row:
            self.filtered_in_a_row = 0
            self._streak_rewards.clear()

    @property
    def failed(self) -> asyncio.Future:
        """Gets NoLearningSignal once dynamic_filter's streak reaches `filter_limit`."""
        return self._failed.future

    def _count_filtered(self, group: Group) -> None:
        self.filtered_in_a_row += 1
        self._streak_rewards.update(e.reward for e in group.episodes if e.trainable)
        if not self.filter_limit:
            return
        # The message is built only when said: this runs once per dropped group.
        if self.filtered_in_a_row == max(self.filter_limit // 4, 1) < self.filter_limit:
            log.warning("%s; sampling goes on, and the run ends if %d in a row are dropped",
                        filter_streak_cause(self.filtered_in_a_row, self._streak_rewards), self.filter_limit)
        if self.filtered_in_a_row >= self.filter_limit and not self.failed.done():
            cause = filter_streak_cause(self.filtered_in_a_row, self._streak_rewards)
            self._failed.fail(NoLearningSignal(f"{cause}. What to do: {WHAT_TO_DO}"))

    def in_flight(self) -> list[int]:
        """Positions of the groups running now (admitted, not finished), re-issues not yet started
        included."""
        return sorted(self._live) + list(self._reissue)

    def take_outcomes(self) -> dict[str, list[int]]:
        """Positions dropped since the last call, by reason ("failed": no trainable episode;
        "filtered": no reward spread under dynamic_filter)."""
        out: dict[str, list[int]] = {}
        for position, reason in self._outcomes:
            out.setdefault(reason, []).append(position)
        self._outcomes.clear()
        return out

    def take_filtered(self) -> list[Group]:
        """The groups dynamic_filter dropped since the last call (kept only once `filtered` is a list)."""
        if self.filtered is None:
            return []
        out, self.filtered = self.filtered, []
        return out

    def state_dict(self) -> dict[str, Any]:
        """The next new stream position, the positions in flight (re-issued on resume: an Env's state
        cannot be saved, so those episodes restart from their task) and the counters."""
        return {"cursor": self.cursor, "in_flight": self.in_flight(), "counters": {"groups_finished": self.groups_finished, "groups_filtered": self.groups_filtered}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Before `run`: continue from `state`'s cursor, re-issuing its in-flight positions first."""
        if self._live or self._jobs:
            raise RuntimeError("Producer.load_state_dict after the producer started")
        self.cursor, self._reissue = state["cursor"], deque(state["in_flight"])
        self.groups_finished, self.groups_filtered = (state["counters"]["groups_finished"],
                                                      state["counters"]["groups_filtered"])

    async def stop(self) -> None:
        self.buffer.close()
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)

    def metrics(self) -> dict[str, float]:
        if not self.dynamic_filter:
            return {}
        return {"filter/groups_dropped": self.groups_filtered,
                "filter/drop_rate": self.groups_filtered / max(self.groups_finished, 1)}


def _informative(episodes: list[Episode]) -> bool:
    """Whether a group's trainable episodes have different rewards (a group-relative signal)."""
    trainable = [e for e in episodes if e.trainable]
    if len(trainable) < 2:
        return False
    rewards = torch.tensor([e.reward for e in trainable])
    return bool(informative_groups(rewards, torch.zeros(len(trainable), dtype=torch.long)).any())
