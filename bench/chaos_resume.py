"""Chaos: the default job killed with SIGKILL at random moments and resumed each time, next to the same
job run without interruption.

    python bench/chaos_resume.py [--kills 5] [--seed 0] [--checkpoint-every 25] [--keep DIR] [--extra k=v ...]

Each kill is a real SIGKILL at a crash point (`agentrl.faults`): during generation (an episode has
just finished while others are mid-generation), in a learner step (after the backward pass, before
the optimizer step), in a weight push (the snapshot written, no engine has loaded it) or in a
checkpoint write (every file in the temporary folder, not yet renamed). The points cycle through all
four kinds, then repeat; the visit that kills is drawn at random over what the rest of the run would
reach. After each kill the same command runs again with `train.resume=auto`; the last run finishes.

Prints, for the interrupted run: the kills (where, when, the step it resumed from), tasks skipped,
tasks duplicated, the largest staleness trained, and both runs' held-out scores (before and after RL)
and wall-clock times.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ROOT, progress, resolve_model, table

CONFIG = "examples/agents/guess_number.yaml"
KINDS = ("generation", "learner_step", "weight_push", "checkpoint_write")


def run_job(out: Path, model: str, crash_at: str | None, args: argparse.Namespace) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    env.pop("AGENTRL_CRASH_AT", None)
    if crash_at:
        env["AGENTRL_CRASH_AT"] = crash_at
    cmd = [sys.executable, "-m", "agentrl.train", "--config", CONFIG, f"model.path={model}",
           f"train.out_dir={out}", "train.resume=auto", f"train.checkpoint_every={args.checkpoint_every}",
           "train.save_rollouts=true", "train.loggers=[jsonl,tensorboard]", *args.extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, -9):
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.returncode, time.perf_counter() - t0, proc.stdout + proc.stderr


def steps_done(out: Path) -> int:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for line in lines if line.endswith("}"))


def draw_visit(kind: str, steps_left: int, args: argparse.Namespace, rng: random.Random) -> int:
    """The visit of `kind` that kills, drawn over what the rest of the run reaches (about)."""
    reach = {"generation": steps_left * args.episodes_per_step, "learner_step": steps_left,
             "weight_push": steps_left, "checkpoint_write": max(steps_left // args.checkpoint_every, 1)}[kind]
    return rng.randint(1, max(int(reach * 0.8), 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400, help="train.steps of the default job")
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--episodes-per-step", type=int, default=64, help="the job's buffer.batch_size")
    ap.add_argument("--extra", nargs="*", default=[], help="more dotted overrides for every run")
    ap.add_argument("--keep", help="keep both runs' folders here (chaos/, plain/) instead of a temp folder")
    args = ap.parse_args()
    args.extra = [f"train.steps={args.steps}", *args.extra]
    model, rng = resolve_model(args.model), random.Random(args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        chaos, plain = base / "chaos", base / "plain"
        kills, chaos_s = [], 0.0
        for i in range(args.kills + 1):
            crash_at = None
            if i < args.kills:
                kind = KINDS[i % len(KINDS)]
                crash_at = f"{kind}:{draw_visit(kind, args.steps - steps_done(chaos), args, rng)}"
            progress(f"chaos run {i + 1}: " + (f"killed at {crash_at}" if crash_at else "to the end"))
            rc, seconds, log = run_job(chaos, model, crash_at, args)
            chaos_s += seconds
            resumed = next((line.split("resumed from ")[1].split(":")[0] for line in log.splitlines()
                            if "resumed from " in line), "fresh start")
            if crash_at:
                kills.append([crash_at, "killed" if rc == -9 else "finished first", Path(resumed).name,
                              steps_done(chaos), f"{seconds:.0f} s"])
            if rc == 0:
                break
        progress("uninterrupted run")
        _, plain_s, _ = run_job(plain, model, None, args)

        from agentrl.checkpoint import audit

        report = audit(chaos)
        runs = {name: json.loads((out / "summary.json").read_text()) for name, out in (("chaos", chaos),
                                                                                     ("plain", plain))}
    print(table(["crash point:visit", "outcome", "resumed from", "records after", "run time"], kills,
                f"\nChaos: {len(kills)} kills of the default job ({args.steps} steps, a checkpoint every "
                f"{args.checkpoint_every})"))
    print(f"\n  task positions (one group each): {report['cursor']} issued, {report['trained']} trained, "
          f"{report['dropped']} dropped and counted, {report['pending']} waiting or in flight at the end")
    print(f"  tasks skipped: {len(report['skipped'])}   tasks duplicated: {len(report['duplicated'])}   "
          f"max trained staleness: {report['max_trained_staleness']} (bound "
          f"{runs['chaos']['config']['buffer']['max_staleness']})")
    rows = [[name, f"{s['eval_before']['score']:.3f}", f"{s['eval_after']['score']:.3f}", f"{secs:.0f} s"]
            for (name, s), secs in zip(runs.items(), (chaos_s, plain_s))]
    print(table(["run", "held-out, warm start", "held-out, after RL", "wall-clock (all runs)"], rows, ""))


if __name__ == "__main__":
    main()
