"""An engine's start and shutdown on CPU: agentrl's `Engine.start` against the vLLM defaults it replaced.

    python bench/engine_start.py [--model default] [--rounds 3] [--runs-only]

Engines alone. Each round starts one engine per side, in a fresh process each (as a run, a test or an eval does),
alternating the order (A B, B A, ...):
  * vllm-defaults: the same engine arguments with vLLM's own choices on CPU: a multiprocess executor
    (the engine-core process spawns a worker process of its own) and agentrl's exit plugin left out
    (`VLLM_PLUGINS`), so the engine core exits through the interpreter's full final collection;
  * agentrl: `Engine.start` as runs use it: the worker inside the engine-core process, with the OpenMP
    settings the multiprocess executor would give it, and the heap frozen at exit.
Per side: seconds from the call to a served first request (`start`, the vLLM import included, as a
command pays it), `shutdown` (AsyncLLM.shutdown until the engine's processes are gone) and the whole
process's wall time. Prints the medians and their ratios.

Whole runs. Then, per round, `python -m agentrl.train --config examples/agents/custom_env.yaml` at 2
steps and 4 eval tasks (what a test or a dry run costs; the warm-started model is built first, outside
the timing), twice in fresh processes:
  * spawn: the engine core spawned by vLLM, which imports torch and vLLM after the command reaches it;
  * fork server: the command starts the fork server once its input is checked
    (`agentrl.rollout.core_process`), which imports them meanwhile on the other core; the engine core
    is a fork of it.
Prints the median whole-process wall time of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import MODEL_HELP, ROOT, median, print_host, progress, resolve_model, table

SIDES = ("vllm-defaults", "agentrl")
RUN_SIDES = ("spawn", "fork server")
RUN_ARGS = ["--config", "examples/agents/custom_env.yaml", "train.steps=2", "data.eval_tasks=4"]
# The spawn side: the same command with the fork server left out (no prestart, vLLM's own context).
SPAWN_ONLY = ("import contextlib, runpy, agentrl.rollout.core_process as c; c.prestart_for = lambda b: False; "
              "c.forked_engine_cores = contextlib.nullcontext; runpy.run_module('agentrl.train', run_name='__main__')")


def child(side: str, model: str) -> None:
    """One engine's life in this process; prints its timings as one JSON line."""
    import asyncio

    from agentrl.config import EngineConfig
    from agentrl.rollout.engine import Engine

    async def main() -> dict:
        cfg = EngineConfig()
        t0 = time.perf_counter()
        if side == "agentrl":
            engine = Engine.start(model, cfg, eos_id=0)
        else:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
            args = AsyncEngineArgs(
                model=model, tokenizer=model, dtype=cfg.dtype, max_model_len=cfg.max_model_len,
                kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, max_num_seqs=cfg.max_num_seqs, seed=cfg.seed,
                enforce_eager=cfg.enforce_eager, disable_log_stats=True, enable_chunked_prefill=False,
            )
            engine = Engine(AsyncLLM.from_engine_args(args), eos_id=0)
        await engine.generate([1, 2, 3], max_tokens=8, seed=0)
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        engine.llm.shutdown()
        return {"start": started, "shutdown": time.perf_counter() - t1}

    print(json.dumps(asyncio.run(main())), flush=True)


def one(side: str, model: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if side == "vllm-defaults":
        env["VLLM_PLUGINS"] = "agentrl_weight_transfer"  # vLLM's own exit, without agentrl's freeze
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", side, "--model", model], env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process": wall}


def one_run(side: str, out: str) -> float:
    head = ["-c", SPAWN_ONLY] if side == "spawn" else ["-m", "agentrl.train"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *head, *RUN_ARGS, f"train.out_dir={out}"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{side} run failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def whole_runs(rounds: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        one_run("fork server", f"{tmp}/warm")  # builds the example's warm-started model, untimed
        walls: dict[str, list[float]] = {s: [] for s in RUN_SIDES}
        for r in range(rounds):
            for side in (RUN_SIDES if r % 2 == 0 else RUN_SIDES[::-1]):
                walls[side].append(one_run(side, f"{tmp}/{r}"))
                progress(f"round {r + 1} {side}: run {walls[side][-1]:.1f}s")
    med = {s: median(walls[s]) for s in RUN_SIDES}
    rows = [[s, f"{med[s]:.1f}"] for s in RUN_SIDES] + [["spawn / fork server", f"{med['spawn'] / med['fork server']:.2f}x"]]
    print(table(["side (median seconds)", "whole run"], rows,
                f"python -m agentrl.train {' '.join(RUN_ARGS)} on {os.cpu_count()} cores, {rounds} rounds"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help=MODEL_HELP)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs-only", action="store_true", help="only the whole runs")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.model)
    if not args.runs_only:
        engines_alone(args)
    whole_runs(args.rounds)


def engines_alone(args: argparse.Namespace) -> None:
    model = resolve_model(args.model)
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for r in range(args.rounds):
        for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
            res = one(side, model)
            runs[side].append(res)
            progress(f"round {r + 1} {side}: start {res['start']:.1f}s, shutdown {res['shutdown']:.1f}s, "
                     f"process {res['process']:.1f}s")
    keys = ("start", "shutdown", "process")
    med = {s: {k: median([x[k] for x in runs[s]]) for k in keys} for s in SIDES}
    rows = [[s] + [f"{med[s][k]:.1f}" for k in keys] for s in SIDES]
    rows.append(["vllm-defaults / agentrl"] + [f"{med['vllm-defaults'][k] / med['agentrl'][k]:.2f}x" for k in keys])
    print(table(["side (median seconds)", "start to first request", "shutdown", "whole process"], rows,
                f"engine start on {os.cpu_count()} cores, {args.rounds} rounds, model {args.model}"))


if __name__ == "__main__":
    print_host()
    main()
