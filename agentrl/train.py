"""`python -m agentrl.train --config x.yaml [dotted.key=value ...]`: wires the stages and runs the loop.

    tasks -> RolloutPool (vLLM engines, many episodes on one uvloop loop) -> StalenessBuffer
          -> Learner.step (DeepSpeed, in a worker thread) -> EngineWeightSync -> EngineFleet

`cluster.backend: local` runs the engines and the one learner rank in this process; `ray` runs each
engine and each learner rank as a Ray actor, on one machine or many (`agentrl.cluster`).

Generation keeps running while the learner steps; the buffer's admission control and drop rule
bound how stale a trained sample can be. Everything a user's input can get wrong (config keys,
YAML, data rows, the env's import path, the model folder, reward rules) is checked by `prepare`
before vLLM or DeepSpeed start, and reported as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from agentrl.buffer import BatchAssembly, StalenessBuffer
from agentrl.config import Config, ConfigError, load_config
from agentrl.config.inert import inert_settings
from agentrl.checkpoint import RunState
from agentrl.data import TaskStream
from agentrl.learning_signal import SignalWatch, signal_metrics, step_signal
from agentrl.metrics import MetricsSink, print_summary, setup_logging
from agentrl.rollout.pool import Producer, RolloutPool, score_episodes, unless_failed
from agentrl.startup import (Prepared, input_error, load_model_format, prepare, start_agent_server, start_workers,
                             stop_agent_server, stop_workers)
from agentrl.types import TrainBatch

log = logging.getLogger("agentrl")


def _run_errors() -> tuple[type[Exception], ...]:
    """Failures that end a run with one line and exit code 1 (read only when something was raised)."""
    from agentrl.cluster import ClusterError
    from agentrl.rollout.fleet import FleetFailed

    from agentrl.learner.ray_ranks import LearnerRankDied
    from agentrl.rollout.failures import EpisodesFailing

    return ClusterError, FleetFailed, LearnerRankDied, EpisodesFailing


def make_train_batch(assembly: BatchAssembly, pad_id: int) -> TrainBatch:
    """Padded tensors; advantages are left to the learner, which holds the critic and reference."""
    return TrainBatch.from_episodes(assembly.episodes, None, pad_id)


def step_record(step: int, assembly: BatchAssembly, metrics: list, pushes: list, pool: RolloutPool,
                window: dict[str, float], overlap_tokens: int, buffer: StalenessBuffer) -> dict[str, Any]:
    episodes = assembly.episodes
    now = time.perf_counter()
    tokens_per_s = (pool.generated_tokens - window["tokens"]) / max(now - window["time"], 1e-9)
    window.update(tokens=pool.generated_tokens, time=now)
    hist = assembly.staleness_hist
    rec: dict[str, Any] = {
        "step": step, "version": step + 1, "episodes": len(episodes),
        "reward_mean": sum(e.reward for e in episodes) / len(episodes),
        "success_rate": sum(e.success for e in episodes) / len(episodes),
        "staleness_hist": hist, "staleness_max": max(hist) if hist else 0,
        "rollout_tokens_per_s": tokens_per_s, "learner_step_s": sum(m.step_time_s for m in metrics),
        "loss": metrics[-1].loss, "grad_norm": metrics[-1].grad_norm, "overlap_tokens": overlap_tokens,
        "push_latency_s": max((p.latency_s for p in pushes if p.ok), default=None),
        "push_pause_s": max((p.pause_s for p in pushes if p.ok), default=None),
        "push_snapshot_s": max((p.snapshot_s for p in pushes if p.ok), default=None),
        "push_failures": sum(not p.ok for p in pushes), "dropped_stale": assembly.dropped_stale,
    }
    rec.update({f"policy/{k}": v for k, v in metrics[-1].policy.items()})
    rec.update({f"episodes/{k}": v for k, v in pool.status_counts.items()})
    rec.update(pool.tool_stats.metrics())
    if pool.scorer is not None:
        rec.update(pool.scorer.metrics())
    if pool.spec.server is not None:
        rec.update(pool.spec.server.stats())
    rec.update({f"buffer/{k}": v for k, v in buffer.stats().items()})
    return rec


@dataclass
class Loop:
    """What the training loop works with, built by `run`."""

    cfg: Config
    pool: RolloutPool
    learner: Any  # Learner or RayLearner
    sync: Any  # EngineWeightSync
    stream: TaskStream
    eval_tasks: list[dict]
    sink: MetricsSink
    pad_id: int
    t_start: float  # perf_counter at the start of this process's run
    summary: dict[str, Any]  # what a checkpoint keeps for the final summary (eval_before)
    state: RunState | None = None  # the checkpoint's state when resuming
    rollouts: Any = None  # RolloutWriter when train.save_rollouts


def _checkpoint_due(cfg: Config, step: int) -> bool:
    every = cfg.train.checkpoint_every
    return bool(every) and ((step + 1) % every == 0 or step == cfg.train.steps - 1)


async def train_loop(lp: Loop) -> dict[str, Any]:
    from agentrl.checkpoint import CheckpointStore, capture, restore, save_run_state

    cfg, pool, learner, sync, state = lp.cfg, lp.pool, lp.learner, lp.sync, lp.state
    fleet = pool.engine
    buffer = StalenessBuffer(cfg.buffer.batch_size, cfg.rollout.n_samples, cfg.buffer.max_staleness,
                             engine_version=fleet.version)
    fleet.on_version = buffer.set_engine_version  # the oldest version any engine serves
    producer = Producer(buffer, pool, lp.stream.__getitem__, cfg.rollout.n_samples, cfg.algo.dynamic_filter,
                        cursor=state.cursor if state else 0, reissue=state.in_flight if state else ())
    if state is not None:
        restore(state, buffer, producer, pool)
    store = CheckpointStore(cfg.train.out_dir, cfg.train.checkpoint_keep)
    producer_task = asyncio.create_task(producer.run())
    window = {"tokens": pool.generated_tokens, "time": time.perf_counter()}
    elapsed_before = state.elapsed_s if state else 0.0
    max_stale_seen = state.max_staleness_seen if state else 0
    signal = SignalWatch(cfg.algo.advantage.type)
    try:
        for step in range(state.step if state else 0, cfg.train.steps):
            assembly = await unless_failed(buffer.get_batch(learner.version), fleet.failed, pool.failed)
            batch = make_train_batch(assembly, lp.pad_id)
            # Checked again on the tensors the learner actually trains on, independently of the buffer.
            trained_staleness = learner.version - int(batch.versions[batch.loss_mask > 0].min())
            if trained_staleness > cfg.buffer.max_staleness:
                raise RuntimeError(f"staleness invariant violated: {trained_staleness} > {cfg.buffer.max_staleness}")
            tokens_before = pool.generated_tokens
            metrics = await asyncio.to_thread(learner.step, batch)
            overlap = pool.generated_tokens - tokens_before
            if learner.version % cfg.weight_sync.every_steps == 0 or step == cfg.train.steps - 1:
                await sync.push(learner.version)
            rec = step_record(step, assembly, metrics, sync.take_results(), pool, window, overlap, buffer)
            pool.failures.flush(f"step {step}")
            rec["trained_staleness_max"] = trained_staleness
            rec.update(producer.metrics())
            rec.update(engine_restarts=fleet.stats()["engine_restarts"], engine_version_min=fleet.version)
            if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0:
                # Runs beside training episodes on whatever weights the engine serves right now.
                rec["eval_score"] = score_episodes(await pool.evaluate(lp.eval_tasks, cfg.data.seed)).score
            max_stale_seen = max(max_stale_seen, trained_staleness)
            # From here to the checkpoint's capture nothing awaits: every task position is accounted
            # for once, in a record or in the checkpoint.
            rec["tasks/trained"] = [g.group_id for g in assembly.groups]
            dropped = producer.take_outcomes()
            sig = step_signal(assembly.groups, len(dropped.get("filtered", [])))
            rec.update(signal_metrics(sig))
            if warning := signal.observe(step, sig):
                log.warning("%s", warning)
            if assembly.dropped_ids:
                dropped["stale"] = assembly.dropped_ids
            rec["tasks/dropped"] = dropped
            rec["elapsed_s"] = elapsed_before + time.perf_counter() - lp.t_start
            lp.sink.log(rec)
            if lp.rollouts is not None:
                lp.rollouts.write(step, assembly.groups)
            if _checkpoint_due(cfg, step):
                snap = capture(step + 1, learner.version, buffer, producer, pool, rec["elapsed_s"], lp.summary,
                               max_stale_seen)

                def fill(folder, snap=snap):
                    learner.save_checkpoint(str(folder / "learner"))
                    save_run_state(folder, snap)

                t0 = time.perf_counter()
                where = await asyncio.to_thread(store.write, step + 1, fill)  # generation goes on meanwhile
                log.info("checkpoint %s written in %.1fs", where, time.perf_counter() - t0)
    finally:
        await producer.stop()
        producer_task.cancel()
        await asyncio.gather(producer_task, return_exceptions=True)
    pushes = await sync.drain()
    return {"max_staleness_seen": max_stale_seen, "buffer": buffer.stats(),
            "final_push_ok": all(p.ok for p in pushes), "learning_signal": signal.summary()}


async def resume_workers(prep: Prepared, learner, sync) -> tuple[RunState, dict[str, Any]]:
    """Load the checkpoint into the learner, then have every engine serve its weights and version
    before the first episode starts."""
    from agentrl.checkpoint import CheckpointStore, load_run_state

    state = load_run_state(prep.resume)
    digest = await asyncio.to_thread(learner.load_checkpoint, str(prep.resume / "learner"))
    if learner.version != state.learner_version:
        raise RuntimeError(f"{prep.resume}: learner version {learner.version} != the run state's "
                           f"{state.learner_version}")
    await sync.push(learner.version)
    failed = [r for r in await sync.landed() if not r.ok]
    if failed:
        raise RuntimeError(f"resume: the engines did not load the checkpoint's weights: {failed[0].error}")
    CheckpointStore(prep.resume.parent.parent).discard_after(state.step)
    log.info("resumed from %s: step %d, version %d, %d finished groups waiting, %d in flight re-issued",
             prep.resume, state.step, learner.version, len(state.ready), len(state.in_flight))
    return state, {"from": str(prep.resume), "step": state.step, "optimizer": digest,
                   "groups_restored": len(state.ready), "groups_reissued": len(state.in_flight)}


async def run(cfg: Config, prep: Prepared) -> dict[str, Any]:
    """Build every stage, evaluate, train, evaluate, save; returns the summary."""
    from agentrl.learner.models import frozen_engine
    from agentrl.rollout.episode import EpisodeSpec
    from agentrl.tools import aclose_shared
    from rewards.sources import RewardCombiner

    t_start = time.perf_counter()
    model_path, tokenizer, fmt = await load_model_format(cfg)
    log.info("model %s; %d train / %d eval tasks; starting vLLM", model_path, len(prep.train_tasks),
             len(prep.eval_tasks))
    scorer = RewardCombiner(cfg.rewards, engine_factory=frozen_engine)
    fleet = learner = sink = rollouts = spec = None
    try:
        fleet, learner, sync = await start_workers(cfg, model_path, tokenizer, fmt.eos_id)
        state, resumed = (await resume_workers(prep, learner, sync)) if prep.resume else (None, None)
        spec = EpisodeSpec(prep.env_cls, cfg.env.kwargs, fmt, cfg.rollout, cfg.engine.max_model_len)
        await start_agent_server(cfg, spec, fleet)
        pool = RolloutPool(fleet, spec, scorer)
        summary: dict[str, Any] = {"model": model_path, "config": cfg.model_dump()}
        kept: dict[str, Any] = dict(state.summary) if state else {}
        if cfg.train.eval_before and state is None:
            kept["eval_before"] = score_episodes(await pool.evaluate(prep.eval_tasks, cfg.data.seed)).__dict__
            log.info("eval before RL: %s", kept["eval_before"])
        summary.update(kept)
        if resumed:
            summary["resumed"] = resumed
        pool.status_counts.clear()
        pool.tool_stats.clear()
        scorer.stats.clear()
        start_step = state.step if state else 0
        sink = MetricsSink(cfg.train.out_dir, cfg.train.steps, show=sys.stderr.isatty() or "CI" not in os.environ,
                           loggers=cfg.train.loggers, start_step=start_step, wandb_project=cfg.train.wandb_project,
                           run_config=cfg.model_dump())
        if cfg.train.save_rollouts:
            from agentrl.rollout.records import RolloutWriter

            rollouts = RolloutWriter(os.path.join(cfg.train.out_dir, "rollouts.jsonl"), start_step)
        t_train = time.perf_counter()
        summary["train"] = await train_loop(Loop(
            cfg, pool, learner, sync, TaskStream(prep.train_tasks, cfg.data.seed), prep.eval_tasks, sink,
            tokenizer.pad_token_id, t_start, kept, state, rollouts))
        summary["train"]["seconds"] = time.perf_counter() - t_train
        await fleet.wait_restarts()  # the held-out eval runs on the whole fleet
        summary["fleet"] = fleet.stats()
        if cfg.train.save_model:  # before the eval after RL, which can end the run (EpisodesFailing)
            summary["saved_model"] = os.path.join(cfg.train.out_dir, "model")
            await asyncio.to_thread(learner.save, summary["saved_model"], tokenizer)
        if cfg.train.eval_after:
            summary["eval_after"] = score_episodes(await pool.evaluate(prep.eval_tasks, cfg.data.seed)).__dict__
            log.info("eval after RL: %s", summary["eval_after"])
        summary["wall_s"] = time.perf_counter() - t_start
        sink.write_summary(summary)
        return summary
    finally:
        for out in (sink, rollouts):
            if out is not None:
                out.close()
        await aclose_shared()
        await scorer.aclose()
        await stop_agent_server(spec)
        await stop_workers(cfg, fleet, learner)


def main(argv: list[str] | None = None) -> int:
    from agentrl.config.help import keys_help

    parser = argparse.ArgumentParser(prog="python -m agentrl.train", description=__doc__.split("\n\n")[0],
                                     epilog=keys_help(Config), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config file (defaults apply when omitted)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. buffer.max_staleness=2")
    args = parser.parse_intermixed_args(argv)
    setup_logging()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM warns on every in-place reload
    try:
        cfg = load_config(args.config, args.overrides)
        for sentence in inert_settings(cfg):
            log.warning("%s", sentence)
        prep = prepare(cfg)
    except ConfigError as exc:  # DataError included
        return input_error(exc)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            summary = runner.run(run(cfg, prep))
        except ConfigError as exc:  # what only the model folder tells (its chat template), before any engine
            return input_error(exc)
        except _run_errors() as exc:  # a cluster that cannot hold the run, a dead learner rank, a failed fleet
            print(f"run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
