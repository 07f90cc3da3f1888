"""`python -m agentrl.eval --config x.yaml --model DIR [--samples K] [--json OUT] [dotted.key=value ...]`:
a model folder (base or trained, or a named model) on the config's held-out tasks.

Each task is sampled K times (the tasks in order, each repeated K times), and episode i gets the
sampling seed `data.seed * 100_003 + i`, as in `RolloutPool.evaluate`: `--samples 1` is exactly the
held-out eval a training run prints before and after RL. Rewards come from the config's sources.

The report: held-out score (mean reward over finished episodes), success rate, pass@k for
k = 1, 2, 4, ... up to K, and episode status counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import time
from typing import Any

from agentrl.config import Config, ConfigError, load_config
from agentrl.rollout.core_process import prestart_for
from agentrl.run.startup import (Prepared, episode_spec, input_error, load_model_format, prepare, stop_agent_server,
                             stop_workers)
from agentrl.types import Episode
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog

log = logging.getLogger("agentrl")

STATUSES = ("ok", "truncated", "env_error", "timeout", "engine_error", "reward_error")
FINISHED = ("ok", "truncated")  # scored episodes; the other statuses are failures, never scored


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from n samples with c successes (Chen et al. 2021, eq. 1):

        pass@k = 1 - C(n - c, k) / C(n, k)

    the chance that k samples drawn without replacement from the n hold at least one success.
    Exact integer binomials (Python ints do not overflow; the quotient is <= 1)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a success
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(samples: int) -> list[int]:
    """1, 2, 4, ... up to `samples`, and `samples` itself."""
    ks = [1 << i for i in range(samples.bit_length()) if 1 << i <= samples]
    return ks if ks[-1] == samples else ks + [samples]


def pass_at_ks(per_task: list[list[Episode]], ks: list[int]) -> tuple[dict[str, float], dict[str, int]]:
    """pass@k averaged over tasks, from each task's finished samples; a task with fewer than k
    finished samples (infrastructure failures) is left out of pass@k. Also the tasks counted per k."""
    values: dict[str, float] = {}
    counted: dict[str, int] = {}
    for k in ks:
        scores = []
        for episodes in per_task:
            done = [e for e in episodes if e.status in FINISHED]
            if len(done) >= k:
                scores.append(pass_at_k(len(done), sum(e.success for e in done), k))
        values[str(k)] = sum(scores) / len(scores) if scores else math.nan
        counted[str(k)] = len(scores)
    return values, counted


def build_report(model: str, n_tasks: int, samples: int, episodes: list[Episode]) -> dict[str, Any]:
    """The report of `episodes`, which are `n_tasks` tasks x `samples`, task-major."""
    from agentrl.rollout.pool import score_episodes

    result = score_episodes(episodes)
    per_task = [episodes[i * samples:(i + 1) * samples] for i in range(n_tasks)]
    pass_k, counted = pass_at_ks(per_task, ks_for(samples))
    status = {s: 0 for s in STATUSES}
    for e in episodes:
        status[e.status] = status.get(e.status, 0) + 1
    return {"model": model, "tasks": n_tasks, "samples": samples, "episodes": len(episodes),
            "score": result.score, "success_rate": result.success_rate, "finished": result.n,
            "pass_at_k": pass_k, "pass_at_k_tasks": counted, "status": status,
            "tool_call_success_rate": result.tool_call_success_rate}


def format_report(report: dict[str, Any]) -> str:
    lines = ["=== agentrl eval ===",
             f"model            : {report['model']}",
             f"tasks            : {report['tasks']} held-out x {report['samples']} samples = "
             f"{report['episodes']} episodes (data.seed {report['seed']})",
             f"held-out score   : {report['score']:.3f}  (mean reward over {report['finished']} finished episodes)",
             f"success rate     : {report['success_rate']:.3f}"]
    for k, value in report["pass_at_k"].items():
        partial = report["pass_at_k_tasks"][k]
        note = "" if partial == report["tasks"] else f"  ({partial} tasks with >= {k} finished samples)"
        lines.append(f"{'pass@' + k:<17}: {value:.3f}{note}")
    if report["tool_call_success_rate"] is not None:
        lines.append(f"tool-call success: {report['tool_call_success_rate']:.3f}")
    lines.append("episodes         : " + "  ".join(f"{s}={n}" for s, n in report["status"].items()))
    means = {k.removeprefix("reward/").removesuffix("/mean"): v for k, v in report["rewards"].items()
             if k.endswith("/mean")}
    lines.append("reward sources   : " + "  ".join(f"{name} mean {v:.3f}" for name, v in means.items()))
    lines.append(f"time             : {report['eval_s']:.1f} s evaluating, {report['wall_s']:.1f} s in all")
    return "\n".join(lines)


async def start_fleet(cfg: Config, model_path: str, eos_id: int):
    """The configured engines (local, or Ray actors), not yet started; the caller starts and stops them."""
    from agentrl.rollout.fleet import EngineFleet

    if cfg.cluster.backend == "local":
        return EngineFleet.local(model_path, cfg.engine, eos_id, cfg.cluster)
    from agentrl.run.cluster import connect

    await asyncio.to_thread(connect, cfg.cluster)
    return EngineFleet.ray(model_path, cfg.engine, eos_id, cfg.cluster)


async def evaluate(cfg: Config, prep: Prepared, samples: int) -> dict[str, Any]:
    from agentrl.learner.models import frozen_engine
    from agentrl.rollout.pool import RolloutPool
    from agentrl.rollout.tools.client import aclose_shared
    from rewards.sources import RewardCombiner

    t_start = time.perf_counter()
    model_path, _, fmt = await load_model_format(cfg)
    scorer = RewardCombiner(cfg.rewards, engine_factory=frozen_engine)
    fleet = spec = None
    try:
        log.info("model %s: starting vLLM (%d engine(s))", model_path, cfg.cluster.engines)
        fleet = await start_fleet(cfg, model_path, fmt.eos_id)
        await fleet.start()
        spec = await episode_spec(cfg, prep.env_cls, fmt, fleet)
        pool = RolloutPool(fleet, spec, scorer)
        tasks = [t for t in prep.eval_tasks for _ in range(samples)]
        log.info("evaluating %d tasks x %d samples = %d episodes", len(prep.eval_tasks), samples, len(tasks))
        t_eval = time.perf_counter()
        episodes = await pool.evaluate(tasks, cfg.data.seed)
        report = build_report(model_path, len(prep.eval_tasks), samples, episodes)
        report.update(seed=cfg.data.seed, rewards=scorer.metrics(), eval_s=time.perf_counter() - t_eval,
                      wall_s=time.perf_counter() - t_start)
        return report
    finally:
        await aclose_shared()
        await scorer.aclose()
        await stop_agent_server(spec)
        await stop_workers(cfg, fleet, None)


def _write_json(path: str, report: dict[str, Any]) -> None:
    from agentrl.utils.files import atomic_write
    from agentrl.rollout.records import jsonable

    atomic_write(path, json.dumps(jsonable(report), indent=2, allow_nan=False))


def main(argv: list[str] | None = None) -> int:
    from agentrl.config.help import keys_help

    parser = argparse.ArgumentParser(prog=prog("eval"), description=__doc__.split("\n\n")[0],
                                     epilog=keys_help(Config), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config file: env, held-out tasks, rollout and reward settings")
    parser.add_argument("--model", help="model folder or named model (default: the config's model.path)")
    parser.add_argument("--samples", type=int, default=1, help="samples per task (pass@k up to this k)")
    parser.add_argument("--json", help="also write the report to this JSON file")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. data.eval_tasks=32")
    args = parser.parse_intermixed_args(argv)
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    from agentrl.telemetry.metrics import setup_logging

    setup_logging()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        cfg = load_config(args.config, args.overrides)
        if args.model:
            cfg.model.path = args.model
        cfg.train.resume = None  # a training setting; eval starts from the model folder
        prep = prepare(cfg)
    except ConfigError as exc:  # DataError included
        return input_error(exc)
    prestart_for(cfg.cluster.backend)
    import uvloop

    from agentrl.run.cluster import ClusterError
    from agentrl.rollout.failures import EpisodesFailing
    from agentrl.rollout.fleet import FleetFailed

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            report = runner.run(evaluate(cfg, prep, args.samples))
        except ConfigError as exc:  # the model folder's chat template
            return input_error(exc)
        except (ClusterError, FleetFailed, EpisodesFailing) as exc:
            print(f"eval failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print(format_report(report))
    if args.json:
        from agentrl.utils.outputs import free_file

        path = free_file(args.json)  # an earlier report is kept: this one gets name-2.json
        _write_json(str(path), report)
        print(f"report written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_and_exit(main)
