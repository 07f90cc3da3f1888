"""`python -m agentrl.train --config x.yaml [dotted.key=value ...]`: wires the stages and runs the loop.

    tasks -> RolloutPool (vLLM, many episodes on one uvloop loop) -> StalenessBuffer
          -> advantages -> Learner.step (DeepSpeed, in a worker thread) -> EngineWeightSync -> engine

Generation keeps running while the learner steps; the buffer's admission control and drop rule
bound how stale a trained sample can be.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from agentrl.algo import informative_groups
from agentrl.buffer import BatchAssembly, BufferClosed, StalenessBuffer
from agentrl.chat import ChatFormat, load_tokenizer
from agentrl.config import Config, ConfigError, load_config
from agentrl.metrics import MetricsSink, setup_logging
from agentrl.rollout import EpisodeSpec, RolloutPool
from agentrl.types import Episode, TrainBatch

log = logging.getLogger("agentrl")


@dataclass
class EvalResult:
    score: float  # mean reward over episodes that finished (ok / truncated)
    success_rate: float
    n: int
    failed: dict[str, int] = field(default_factory=dict)  # infrastructure failures, not scored
    # Share of finished episodes with a tool call the server executed without error (the env's
    # info["tool_success"]); None when the env reports no tool use.
    tool_call_success_rate: float | None = None


def score_episodes(episodes: list[Episode]) -> EvalResult:
    done = [e for e in episodes if e.status in ("ok", "truncated")]
    failed = Counter(e.status for e in episodes if e.status not in ("ok", "truncated"))
    n = max(len(done), 1)
    result = EvalResult(sum(e.reward for e in done) / n, sum(e.success for e in done) / n, len(done), dict(failed))
    if any("tool_success" in e.info.get("env", {}) for e in done):
        result.tool_call_success_rate = sum(bool(e.info["env"].get("tool_success")) for e in done) / n
    return result


def make_train_batch(assembly: BatchAssembly, pad_id: int) -> TrainBatch:
    """Padded tensors; advantages are left to the learner, which holds the critic and reference."""
    return TrainBatch.from_episodes(assembly.episodes, None, pad_id)


class Producer:
    """Admits groups through the buffer and runs them on the pool until stopped."""

    def __init__(self, buffer: StalenessBuffer, pool: RolloutPool, tasks: Iterator[dict], n: int,
                 dynamic_filter: bool = False) -> None:
        """`dynamic_filter`: groups whose trainable episodes all got the same reward carry no group-
        relative signal; they give their slot back and another group is sampled (DAPO)."""
        self.buffer, self.pool, self.tasks, self.n = buffer, pool, tasks, n
        self.dynamic_filter = dynamic_filter
        self.groups_finished = self.groups_filtered = 0
        self._jobs: set[asyncio.Task] = set()
        self._next_id = 0

    async def run(self) -> None:
        try:
            while True:
                version = await self.buffer.admit()
                job = asyncio.create_task(self._group(next(self.tasks), self._next_id, version))
                self._next_id += 1
                self._jobs.add(job)
                job.add_done_callback(self._jobs.discard)
        except BufferClosed:
            pass

    async def _group(self, task: dict, group_id: int, version: int) -> None:
        group = await self.pool.group(task, group_id, self.n, version)
        if self.buffer.closed:
            return
        self.groups_finished += 1
        if self.dynamic_filter and not _informative(group.episodes):
            self.groups_filtered += 1
            self.buffer.release()
            return
        self.buffer.put(group)

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
        "push_failures": sum(not p.ok for p in pushes), "dropped_stale": assembly.dropped_stale,
    }
    rec.update({f"policy/{k}": v for k, v in metrics[-1].policy.items()})
    rec.update({f"episodes/{k}": v for k, v in pool.status_counts.items()})
    rec.update(pool.tool_stats.metrics())
    if pool.scorer is not None:
        rec.update(pool.scorer.metrics())
    rec.update({f"buffer/{k}": v for k, v in buffer.stats().items()})
    return rec


async def train_loop(cfg: Config, pool: RolloutPool, learner, sync, train_iter, eval_tasks: list[dict],
                     sink: MetricsSink, pad_id: int) -> dict[str, Any]:
    buffer = StalenessBuffer(cfg.buffer.batch_size, cfg.rollout.n_samples, cfg.buffer.max_staleness)
    sync.on_pushed = buffer.set_engine_version
    producer = Producer(buffer, pool, train_iter, cfg.rollout.n_samples, cfg.algo.dynamic_filter)
    producer_task = asyncio.create_task(producer.run())
    window = {"tokens": pool.generated_tokens, "time": time.perf_counter()}
    max_stale_seen = 0
    try:
        for step in range(cfg.train.steps):
            assembly = await buffer.get_batch(learner.version)
            batch = make_train_batch(assembly, pad_id)
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
            rec["trained_staleness_max"] = trained_staleness
            rec.update(producer.metrics())
            if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0:
                # Runs beside training episodes on whatever weights the engine serves right now.
                rec["eval_score"] = score_episodes(await pool.evaluate(eval_tasks, cfg.data.seed)).score
            max_stale_seen = max(max_stale_seen, trained_staleness)
            sink.log(rec)
    finally:
        await producer.stop()
        producer_task.cancel()
        await asyncio.gather(producer_task, return_exceptions=True)
    pushes = await sync.drain()
    return {"max_staleness_seen": max_stale_seen, "buffer": buffer.stats(),
            "final_push_ok": all(p.ok for p in pushes)}


def critic_init_path(cfg: Config, model_path: str) -> str:
    """critic.init_from: 'actor', 'reward_model' (the first reward_model source's folder) or a folder."""
    if cfg.critic.init_from == "actor":
        return model_path
    if cfg.critic.init_from == "reward_model":
        source = next(s for s in cfg.rewards.sources if s.type == "reward_model")
        return source.reward_model["path"]
    return cfg.critic.init_from


def build_learner(cfg: Config, model_path: str, tokenizer):
    from agentrl.data import lm_batches
    from agentrl.learner import Learner

    unsup = None
    if cfg.learner.unsup_coef > 0:
        unsup = lm_batches(cfg.learner.unsup_data, tokenizer, cfg.learner.unsup_batch_size,
                           cfg.engine.max_model_len, cfg.train.seed)
    critic_path = critic_init_path(cfg, model_path) if cfg.algo.advantage == "gae" else None
    return Learner(model_path, cfg.learner, cfg.algo, cfg.rollout.temperature, cfg.buffer.batch_size,
                   critic=cfg.critic, critic_path=critic_path, total_steps=cfg.train.steps, unsup_batches=unsup)


def resolve_model(cfg: Config) -> str:
    if cfg.model.path:
        return cfg.model.path
    from agentrl.default_model import ensure_default_model

    return str(ensure_default_model(cfg.model.default))


async def run(cfg: Config) -> dict[str, Any]:
    """Build every stage, evaluate, train, evaluate, save; returns the summary."""
    from agentrl.data import load_tasks, task_stream
    from agentrl.engine import Engine
    from agentrl.env import load_env
    from agentrl.weight_sync import EngineWeightSync
    from rewards.sources import RewardCombiner

    t_start = time.perf_counter()
    env_cls = load_env(cfg.env.import_path)
    train_tasks, eval_tasks = load_tasks(cfg.data, env_cls)
    model_path = await asyncio.to_thread(resolve_model, cfg)
    tokenizer = load_tokenizer(model_path)
    fmt = ChatFormat(tokenizer)
    log.info("model %s; %d train / %d eval tasks; starting vLLM", model_path, len(train_tasks), len(eval_tasks))
    scorer = RewardCombiner(cfg.rewards)
    engine = Engine.start(model_path, cfg.engine, fmt.eos_id)
    try:
        learner = await asyncio.to_thread(build_learner, cfg, model_path, tokenizer)
        spec = EpisodeSpec(env_cls, cfg.env.kwargs, fmt, cfg.rollout, cfg.engine.max_model_len)
        pool = RolloutPool(engine, spec, scorer)
        summary: dict[str, Any] = {"model": model_path, "config": cfg.model_dump()}
        if cfg.train.eval_before:
            summary["eval_before"] = score_episodes(await pool.evaluate(eval_tasks, cfg.data.seed)).__dict__
            log.info("eval before RL: %s", summary["eval_before"])
        pool.status_counts.clear()
        pool.tool_stats.clear()
        scorer.stats.clear()
        sink = MetricsSink(cfg.train.out_dir, cfg.train.steps, show=sys.stderr.isatty() or "CI" not in os.environ)
        sync = EngineWeightSync(learner.state_dict_cpu, engine, cfg.weight_sync.deadline_s)
        t_train = time.perf_counter()
        summary["train"] = await train_loop(cfg, pool, learner, sync, task_stream(train_tasks, cfg.data.seed),
                                            eval_tasks, sink, tokenizer.pad_token_id)
        summary["train"]["seconds"] = time.perf_counter() - t_train
        if cfg.train.eval_after:
            summary["eval_after"] = score_episodes(await pool.evaluate(eval_tasks, cfg.data.seed)).__dict__
            log.info("eval after RL: %s", summary["eval_after"])
        if cfg.train.save_model:
            summary["saved_model"] = os.path.join(cfg.train.out_dir, "model")
            await asyncio.to_thread(learner.save, summary["saved_model"], tokenizer)
        summary["wall_s"] = time.perf_counter() - t_start
        sink.write_summary(summary)
        return summary
    finally:
        from agentrl.remote_tools import aclose_shared

        await aclose_shared()
        await scorer.aclose()
        engine.shutdown()


def print_summary(summary: dict[str, Any]) -> None:
    before, after = summary.get("eval_before"), summary.get("eval_after")
    lines = ["", "=== agentrl summary ==="]
    if before:
        lines.append(f"held-out eval score, warm start : {before['score']:.3f}  (n={before['n']}, failed={before['failed']})")
    if after:
        lines.append(f"held-out eval score, after RL   : {after['score']:.3f}  (n={after['n']}, failed={after['failed']})")
    if before and after:
        lines.append(f"improvement                     : {after['score'] - before['score']:+.3f}")
    for label, res in (("warm start", before), ("after RL  ", after)):
        if res and res.get("tool_call_success_rate") is not None:
            lines.append(f"tool-call success, {label}   : {res['tool_call_success_rate']:.3f}")
    train = summary.get("train", {})
    lines.append(f"max staleness trained           : {train.get('max_staleness_seen')}")
    lines.append(f"RL time {train.get('seconds', 0):.0f}s, total wall time {summary.get('wall_s', 0):.0f}s")
    if "saved_model" in summary:
        lines.append(f"trained model                   : {summary['saved_model']}")
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config file (defaults apply when omitted)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. buffer.max_staleness=2")
    args = parser.parse_intermixed_args(argv)
    setup_logging()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM warns on every in-place reload
    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        summary = runner.run(run(cfg))
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
