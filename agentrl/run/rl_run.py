"""One RL run and its owner, `RLRun`, shaped like torchtune's recipes:

    setup()            engines, learner ranks, weight sync, the rollout pool, the task stream, the
                       staleness buffer and its producer; a resumed run's checkpoint loaded into them
    train()            evaluate, the loop (batch -> Learner.step -> weight push -> metrics ->
                       checkpoint), save the model, evaluate; returns the summary
    save_checkpoint()  composes every component's own state dict (`agentrl.run.checkpoint`); a write that
                       fails (a full disk) is logged and retried at the next due checkpoint
    load_checkpoint()  puts them back, then has every engine serve the checkpoint's weights; changes
                       nothing outside this run's own out_dir (a rollback within it moves the later
                       checkpoints aside)
    SIGTERM / SIGINT   stop at the next safe point with a checkpoint, exit 128 + the signal's number
                       (`agentrl.run.checkpoint.preempt`)
    cleanup()          releases everything `setup` made, in reverse order, through one exit stack

    tasks -> RolloutPool (vLLM engines, many episodes on one uvloop loop) -> StalenessBuffer
          -> Learner.step (DeepSpeed, in a worker thread) -> EngineWeightSync -> EngineFleet

Generation keeps running while the learner steps; the buffer's admission control and drop rule
bound how stale a trained sample can be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from agentrl.utils import faults
from agentrl.run.buffer import BatchAssembly, StalenessBuffer
from agentrl.run.step_record import step_record
from agentrl.run.checkpoint import (CheckpointError, CheckpointStore, CheckpointWriteError, RunState, capture, load_run_state,
                                restore, save_run_state)
from agentrl.run.checkpoint.preempt import RunStopped, StopRequest
from agentrl.config import Config, ConfigError
from agentrl.data import TaskStream
from agentrl.models.demos import start_verdict
from agentrl.telemetry.learning_signal import SignalWatch, filter_streak_limit, signal_metrics, step_signal
from agentrl.telemetry.metrics import MetricsSink
from agentrl.telemetry.tool_use import ToolUseWatch
from agentrl.rollout.failing import unless_failed
from agentrl.rollout.pool import EvalResult, Producer, RolloutPool, score_episodes
from agentrl.run.startup import (Prepared, episode_spec, load_model_format, start_teacher, start_workers, stop_agent_server,
                                 stop_teacher, stop_workers)
from agentrl.types import TrainBatch

if TYPE_CHECKING:
    from agentrl.learner.ray_ranks import RayLearner
    from agentrl.learner.rl import Learner
    from agentrl.weights.sync import EngineWeightSync
    from agentrl.rollout.fleet import EngineFleet

log = logging.getLogger("agentrl")


def _merged(first: dict[str, list[int]], then: dict[str, list[int]]) -> dict[str, list[int]]:
    """Dropped positions by reason, `first`'s before `then`'s."""
    return {reason: first.get(reason, []) + then.get(reason, []) for reason in {**first, **then}}


class RLRun:
    """Owns one run's components from `setup` to `cleanup`; use as `async with RLRun(cfg, prep) as run:`
    (`cleanup` on the way out, also after an error half-way through `setup`)."""

    def __init__(self, cfg: Config, prep: Prepared) -> None:
        self.cfg, self.prep = cfg, prep
        self.t_start = time.perf_counter()  # this process's part of the run starts now
        self._stack = contextlib.AsyncExitStack()
        self.fleet: EngineFleet | None = None
        self.learner: Union[Learner, RayLearner, None] = None  # one rank here, or K Ray actors
        self.sync: EngineWeightSync | None = None
        self.pool: RolloutPool | None = None
        self.stream: TaskStream | None = None
        self.buffer: StalenessBuffer | None = None
        self.producer: Producer | None = None
        self.store = CheckpointStore(cfg.train.out_dir, cfg.train.checkpoint_keep)
        self.step = 0  # the next step to train
        self.elapsed_before = 0.0  # wall-clock seconds of the earlier processes of a resumed run
        self.max_stale_seen = 0
        self.kept: dict[str, Any] = {}  # what a checkpoint keeps for the final summary (eval_before)
        self.resumed: dict[str, Any] | None = None
        self.tool_use = ToolUseWatch()  # reward rising while tool calls stop: said once per window
        self.eval_records: Any = None  # eval_episodes.jsonl (agentrl.rollout.records), opened by train()
        self.stop = StopRequest()
        self.saved_step = 0  # the step of the newest checkpoint written or loaded by this process
        self.carried: dict[str, list[int]] = {}  # a stopped run's unrecorded drops, for the first record
        self.checkpoint_failures: list[str] = []

    async def __aenter__(self) -> "RLRun":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.cleanup()

    # -- setup ------------------------------------------------------------------------------------

    async def setup(self) -> None:
        from agentrl.learner.models import frozen_engine
        from agentrl.rollout.tools.client import aclose_shared
        from rewards.sources import RewardCombiner

        cfg, prep = self.cfg, self.prep
        self.model_path, self.tokenizer, fmt = await load_model_format(cfg)
        log.info("model %s; %d train / %d eval tasks; starting vLLM", self.model_path, len(prep.train_tasks),
                 len(prep.eval_tasks))
        scorer = RewardCombiner(cfg.rewards, engine_factory=frozen_engine)
        # Registered before they start: whatever did start is stopped, however far start-up got.
        self._stack.push_async_callback(lambda: stop_workers(cfg, self.fleet, self.learner))
        self._stack.push_async_callback(scorer.aclose)
        self._stack.push_async_callback(aclose_shared)
        self.fleet, self.learner, self.sync = await start_workers(cfg, self.model_path, self.tokenizer, fmt.eos_id)
        # From here a signal stops the run at its next safe point (before: the default action, nothing to
        # save yet). After start_workers: ray.init sets a SIGTERM handler of its own, which this replaces.
        self.stop.install()
        self._stack.callback(self.stop.uninstall)
        spec = await episode_spec(cfg, prep.env_cls, fmt, self.fleet)
        self._stack.push_async_callback(stop_agent_server, spec)
        teacher = await start_teacher(cfg, self.model_path, self.tokenizer, fmt.eos_id)  # algo.teacher on an engine
        self._stack.push_async_callback(stop_teacher, teacher)
        self.pool = RolloutPool(self.fleet, spec, scorer, teacher)
        self.stream = TaskStream(prep.train_tasks, cfg.data.seed)
        self.buffer = StalenessBuffer(cfg.buffer.batch_size, cfg.rollout.n_samples, cfg.buffer.max_staleness,
                                      engine_version=self.fleet.version, versions_per_batch=cfg.learner.mini_batches,
                                      max_ahead_batches=cfg.buffer.max_ahead_batches)
        self.fleet.on_version = self.buffer.set_engine_version  # the oldest version any engine serves
        self.producer = Producer(self.buffer, self.pool, self.stream.__getitem__, cfg.rollout.n_samples,
                                 cfg.algo.dynamic_filter,
                                 filter_streak_limit(cfg.buffer.batch_size // cfg.rollout.n_samples))
        if prep.resume is not None:
            await self.load_checkpoint(prep.resume)
        faults.reached("startup")

    def _components(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "producer": self.producer, "pool": self.pool, "stream": self.stream}

    # -- checkpoints ------------------------------------------------------------------------------

    async def load_checkpoint(self, folder: Path) -> None:
        """Load the checkpoint into the learner and the components, then have every engine serve its
        weights and version before the first episode starts. Only this run's own checkpoints change:
        resumed from an older one of them, the newer ones are moved aside (`CheckpointStore.set_aside_after`);
        resumed from another run's, that run's folder is only read."""
        from agentrl.learner.state import CheckpointFileError

        try:
            state = load_run_state(folder)
            digest = await asyncio.to_thread(self.learner.load_checkpoint, str(folder / "learner"))
        except (CheckpointError, CheckpointFileError) as exc:
            raise ConfigError(f"train.resume: {exc}") from None
        if self.learner.version != state.learner_version:
            raise RuntimeError(f"{folder}: learner version {self.learner.version} != the run state's "
                               f"{state.learner_version}")
        await self.sync.push(self.learner.version)
        failed = [r for r in await self.sync.landed() if not r.ok]
        if failed:
            raise RuntimeError(f"resume: the engines did not load the checkpoint's weights: {failed[0].error}")
        restore(state, self._components())
        self.store.set_aside_after(state.step)  # this run's own checkpoints only, never the source run's
        self.step, self.elapsed_before, self.max_stale_seen = state.step, state.elapsed_s, state.max_staleness_seen
        self.saved_step, self.carried = state.step, dict(state.outcomes)
        self.kept = dict(state.summary)
        log.info("resumed from %s: step %d, version %d, %d finished groups waiting, %d in flight re-issued",
                 folder, state.step, self.learner.version, len(state.ready), len(state.in_flight))
        self.resumed = {"from": str(folder), "step": state.step, "optimizer": digest,
                        "groups_restored": len(state.ready), "groups_reissued": len(state.in_flight)}

    async def save_checkpoint(self, steps_done: int, elapsed_s: float,
                              outcomes: dict[str, list[int]] | None = None) -> Path | None:
        """Capture the components now (no await between their states), then write the learner's and
        the run's files while generation goes on. A failed write (CheckpointWriteError: its temporary
        folder removed, the older checkpoints intact) is logged and counted, and the run goes on: the
        next due checkpoint tries again. Returns the folder written, or None."""
        snap: RunState = capture(steps_done, self.learner.version, self._components(), elapsed_s, self.kept,
                                 self.max_stale_seen, outcomes)

        def fill(folder: Path) -> None:
            self.learner.save_checkpoint(str(folder / "learner"))
            save_run_state(folder, snap)

        t0 = time.perf_counter()
        try:
            where = await asyncio.to_thread(self.store.write, steps_done, fill)
        except CheckpointWriteError as exc:
            self.checkpoint_failures.append(str(exc))
            log.error("%s (training goes on; the next due checkpoint tries again)", exc)
            return None
        self.saved_step = steps_done
        log.info("checkpoint %s written in %.1fs", where, time.perf_counter() - t0)
        return where

    async def _stop_here(self, outcomes: dict[str, list[int]] | None = None) -> None:
        """A signal asked the run to stop: checkpoint the steps trained since the last one, then raise
        RunStopped (exit status 128 + the signal's number) through the clean-up."""
        # With no step since the last checkpoint, the positions dropped since are beyond what it
        # accounts for (in flight or not yet issued when it was taken): a resume issues them again.
        if self.step > self.saved_step:
            await self.save_checkpoint(self.step, self.elapsed_before + time.perf_counter() - self.t_start, outcomes)
        await self.sync.drain()  # the engines finish the push in flight (bounded by its deadline) before they stop
        own = self.store.latest()
        how = ("train.resume=auto" if own is not None or self.resumed is None  # else a branch that has none yet
               else f"train.resume={self.resumed['from']}")
        if self.saved_step == self.step:
            log.warning("stopped by %s after step %d: %s; run the same command with %s to continue", self.stop.name,
                        self.step, f"checkpoint {own or self.resumed['from']}" if self.step else "no step trained", how)
        else:
            log.error("stopped by %s after step %d without a checkpoint of it (see above); %s continues from %s",
                      self.stop.name, self.step, how, own or (self.resumed or {}).get("from", "scratch"))
        raise RunStopped(self.stop.signum)

    async def _batch_or_stop(self, learner_version: int) -> BatchAssembly | None:
        """The next batch, or None when a stop is requested while waiting for it. The wait is given up
        only while it has dropped no stale group: the ids of those live in the pending call until it
        returns (then the batch is awaited, trained, and the run stops after it)."""
        dropped_before = self.buffer.stats()["groups_dropped_stale"]
        get = asyncio.ensure_future(self.buffer.get_batch(learner_version))
        stop = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait([get, stop], return_when=asyncio.FIRST_COMPLETED)
            if get.done() or self.buffer.stats()["groups_dropped_stale"] != dropped_before:
                return await get
            return None
        finally:
            for task in (get, stop):
                task.cancel()
            await asyncio.gather(get, stop, return_exceptions=True)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.train.checkpoint_every
        return bool(every) and ((step + 1) % every == 0 or step == self.cfg.train.steps - 1)

    # -- train ------------------------------------------------------------------------------------

    async def _evaluate(self, label: str = "during") -> EvalResult:
        """The held-out tasks, scored and timed (and their episodes written down, `train.save_rollouts.eval`)."""
        t = time.perf_counter()
        episodes = await self.pool.evaluate(self.prep.eval_tasks, self.cfg.data.seed)
        result = score_episodes(episodes)
        result.seconds = time.perf_counter() - t
        if self.eval_records is not None:
            self.eval_records.write_eval(self.step, label, episodes)
        return result

    async def train(self) -> dict[str, Any]:
        """Evaluate, train `train.steps` steps (from a resumed run's step), save, evaluate; the summary."""
        cfg, pool = self.cfg, self.pool
        # out_dir: the folder this run writes to, which a run typed twice takes anew (agentrl.run.checkpoint.placement)
        summary: dict[str, Any] = {"model": self.model_path, "config": cfg.model_dump(), "out_dir": cfg.train.out_dir}
        from agentrl.rollout.records import run_writers

        rollouts, self.eval_records = run_writers(cfg.train.save_rollouts, cfg.train.out_dir, self.step, cfg.train.seed,
                                                  lambda ids: self.tokenizer.batch_decode([[t] for t in ids]))
        for writer in (rollouts, self.eval_records):
            if writer is not None:
                self._stack.callback(writer.close)
        if cfg.train.eval_before and self.resumed is None:
            self.kept["eval_before"] = (await self._evaluate("before")).__dict__
            log.info("eval before RL: %s", self.kept["eval_before"])
            if cfg.model.path is None and (why := start_verdict(self.kept["eval_before"]["score"],
                                                                self.kept["eval_before"]["success_rate"],
                                                                cfg.model.default)):
                raise ConfigError(why)  # ends the run as an input error (exit 2), before any RL step
        summary.update(self.kept)
        if self.resumed is not None:
            summary["resumed"] = self.resumed
        else:
            pool.clear_counters()  # the training counters start after the evaluation
        sink = MetricsSink(cfg.train.out_dir, cfg.train.steps, show=sys.stderr.isatty() or "CI" not in os.environ,
                           loggers=cfg.train.loggers, start_step=self.step, wandb_project=cfg.train.wandb_project,
                           run_config=cfg.model_dump())
        self._stack.callback(sink.close)
        t_train = time.perf_counter()
        summary["train"] = await self._loop(sink, rollouts)
        summary["train"]["seconds"] = time.perf_counter() - t_train
        await self.fleet.wait_restarts()  # the held-out eval runs on the whole fleet
        summary["fleet"] = self.fleet.stats()
        if cfg.train.save_model:  # before the eval after RL, which can end the run (EpisodesFailing)
            summary["saved_model"] = os.path.join(cfg.train.out_dir, "model")
            await asyncio.to_thread(self.learner.save, summary["saved_model"], self.tokenizer)
        if cfg.train.eval_after:
            summary["eval_after"] = (await self._evaluate("after")).__dict__
            log.info("eval after RL: %s", summary["eval_after"])
        summary["wall_s"] = time.perf_counter() - self.t_start
        sink.write_summary(summary)
        return summary

    def _account_tasks(self, step: int, rec: dict[str, Any], assembly: Any, signal: SignalWatch) -> None:
        """The step's trained and dropped task positions, learning signal and elapsed time into `rec`
        (synchronous: nothing may run between this and the checkpoint's capture)."""
        rec["tasks/trained"] = [g.group_id for g in assembly.groups]
        dropped = _merged(self.carried, self.producer.take_outcomes())  # a stopped run's drops go in first
        self.carried = {}
        sig = step_signal(assembly.groups, len(dropped.get("filtered", [])))
        rec.update(signal_metrics(sig))
        if warning := signal.observe(step, sig):
            log.warning("%s", warning)
        if warning := self.tool_use.observe(step, rec["reward_mean"], rec["tools/call_episode_frac"]):
            log.warning("%s", warning)
        if assembly.dropped_ids:
            dropped["stale"] = assembly.dropped_ids
        rec["tasks/dropped"] = dropped
        rec["elapsed_s"] = self.elapsed_before + time.perf_counter() - self.t_start

    async def _loop(self, sink: MetricsSink, rollouts: Any) -> dict[str, Any]:
        cfg, pool, learner, sync, buffer, producer = (self.cfg, self.pool, self.learner, self.sync, self.buffer,
                                                      self.producer)
        fleet = self.fleet
        producer.filtered = [] if rollouts is not None else None  # dropped groups, written beside the trained
        producer_task = asyncio.create_task(producer.run())
        window = {"tokens": pool.generated_tokens, "time": time.perf_counter()}
        signal = SignalWatch(cfg.algo.advantage.type)
        pad_id = self.tokenizer.pad_token_id
        try:
            for step in range(self.step, cfg.train.steps):
                waited_from = time.perf_counter()
                assembly = await unless_failed(self._batch_or_stop(learner.version), fleet.failed, pool.failed,
                                               producer.failed)
                if assembly is None:  # stopped while waiting: the drops since the last record go in the checkpoint
                    await self._stop_here(_merged(self.carried, producer.take_outcomes()))
                batch_wait_s = time.perf_counter() - waited_from  # the learner idle, waiting for episodes
                # Advantages are left to the learner, which holds the critic and reference.
                batch = TrainBatch.from_episodes(assembly.episodes, None, pad_id)
                batch.record_values = rollouts is not None  # the learner's per-token values: only if written
                # Checked again on the tensors the learner actually trains on, independently of the buffer.
                trained_staleness = learner.version - int(batch.versions[batch.loss_mask > 0].min())
                if trained_staleness > cfg.buffer.max_staleness:
                    raise RuntimeError(f"staleness invariant violated: {trained_staleness} > {cfg.buffer.max_staleness}")
                tokens_before = pool.generated_tokens
                called = time.perf_counter()
                metrics = await asyncio.to_thread(learner.step, batch)
                learner_call_s = time.perf_counter() - called
                buffer.set_learner_version(learner.version)  # before the push: E never passes W
                overlap = pool.generated_tokens - tokens_before
                if learner.version % cfg.weight_sync.every_steps == 0 or step == cfg.train.steps - 1:
                    await sync.push(learner.version)
                rec = step_record(step, assembly, metrics, sync.take_results(), pool, window, overlap, buffer)
                pool.failures.flush(f"step {step}")
                rec.update(trained_staleness_max=trained_staleness, batch_wait_s=batch_wait_s, learner_call_s=learner_call_s)
                rec.update(producer.metrics())
                rec.update(engine_restarts=fleet.stats()["engine_restarts"], engine_version_min=fleet.version)
                if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0 and not self.stop.requested:
                    # Runs beside training episodes on whatever weights the engine serves right now.
                    rec["eval_score"] = (await self._evaluate()).score
                self.max_stale_seen = max(self.max_stale_seen, trained_staleness)
                # From here to the checkpoint's capture nothing awaits: every task position is accounted
                # for once, in a record or in the checkpoint.
                self._account_tasks(step, rec, assembly, signal)
                sink.log(rec)
                if rollouts is not None:
                    rollouts.write(step, assembly.groups, assembly.episodes, metrics[0].token_values)
                    rollouts.write_dropped(step, producer.take_filtered(), "filtered")
                    rollouts.write_dropped(step, assembly.dropped_groups, "stale")
                self.step = step + 1
                if self._checkpoint_due(step) or (self.stop.requested and self.step > self.saved_step):
                    await self.save_checkpoint(step + 1, rec["elapsed_s"])  # generation goes on meanwhile
                if self.stop.requested:
                    await self._stop_here()
        finally:
            await producer.stop()
            producer_task.cancel()
            await asyncio.gather(producer_task, return_exceptions=True)
        if self.stop.requested:  # during the last step: its checkpoint is written; the rest is for the resume
            await self._stop_here()
        pushes = await sync.drain()
        return {"max_staleness_seen": self.max_stale_seen, "buffer": buffer.stats(), "final_push_ok": all(p.ok for p in pushes),
                "learning_signal": signal.summary(), "tool_use": self.tool_use.summary(),
                "checkpoint_failures": self.checkpoint_failures}

    # -- cleanup ----------------------------------------------------------------------------------

    async def cleanup(self) -> None:
        """Release everything `setup` and `train` made, last made first; safe to call twice."""
        await self._stack.aclose()
