"""The newcomer's path on the embedded default, timed from an empty model cache, task by task: a dry-run
verdict (`agentrl.check --policy scripted`: no weights, the teacher replayed through the env; goal <= 10 s),
a warm-start verdict (the model built and warm-started with the default teacher settings and judged by the
held-out eval before RL), a trained run; and the held-out gain (goal: >= +0.2, or the run stopped at the
warm start with a message that names the fix).

    python bench/newcomer.py [--only even,divisible,custom_env,first_env] [--steps 100] [--keep DIR]

Tasks: two written for this benchmark as a newcomer would (bench/newcomer_tasks/: several right answers a
turn, a hint and one retry after a wrong one), run with no setting but the env, its teacher module, the turn
budget and `train.steps`; and the shipped ones a newcomer copies (examples/agents/custom_env.yaml,
examples/tutorials/first_env.yaml) as written. Each task gets a cache of its own, empty at its start.
One run at a time (two at once on 2 cores each take about twice as long).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, print_host, progress, table

NEW_TASK = ("rollout.max_turns=2", "rollout.max_tokens_per_turn=4")
TASKS = {
    "even": (None, ("env.import_path=bench.newcomer_tasks.even:EvenEnv",
                    "model.default.task=bench.newcomer_tasks.even", *NEW_TASK)),
    "divisible": (None, ("env.import_path=bench.newcomer_tasks.divisible:DivisibleEnv",
                         "model.default.task=bench.newcomer_tasks.divisible", *NEW_TASK)),
    "custom_env": ("examples/agents/custom_env.yaml", ()),
    "first_env": ("examples/tutorials/first_env.yaml", ()),
}


def _argv(module: str, config: str | None, overrides: tuple[str, ...], *more: str) -> list[str]:
    return [sys.executable, "-m", module, *(["--config", config] if config else []), *overrides, *more]


def dry_run(config: str | None, overrides: tuple[str, ...], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(_argv("agentrl.check", config, overrides, "--policy", "scripted"), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    last = (done.stdout.strip().splitlines() or [done.stderr.strip()[-200:]])[-1]
    verdict = "passed" if done.returncode == 0 else f"exit {done.returncode}: {last[:100]}"
    return time.perf_counter() - t0, verdict


def train(config: str | None, overrides: tuple[str, ...], out: Path, env: dict[str, str]) -> dict:
    """The run, its stderr read as it comes: seconds to the warm-start verdict (the eval before RL, or the
    config error that stops it), seconds in all, and the scores or the message."""
    cmd = _argv("agentrl.train", config, overrides, f"train.out_dir={out}")
    t0, verdict_s, error, log = time.perf_counter(), None, "", []
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        for line in proc.stderr:
            log.append(line)
            if verdict_s is None and ("eval before RL" in line or line.startswith("config error:")):
                verdict_s = time.perf_counter() - t0
            if line.startswith(("config error:", "run failed:")):
                error = line.strip()
    row = {"rc": proc.returncode, "verdict_s": verdict_s, "total_s": time.perf_counter() - t0, "error": error}
    summary = out / "summary.json"
    if proc.returncode == 0 and summary.exists():
        got = json.loads(summary.read_text())
        row["before"], row["after"] = got["eval_before"]["score"], got["eval_after"]["score"]
    elif not error:
        row["error"] = "".join(log[-5:])[-300:]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(TASKS), help="comma-separated tasks: " + ", ".join(TASKS))
    ap.add_argument("--steps", type=int, default=100, help="train.steps of the two new tasks")
    ap.add_argument("--keep", help="keep each task's cache and run folder here")
    args = ap.parse_args()
    print_host()
    rows, messages = [], []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        for name in args.only.split(","):
            config, overrides = TASKS[name]
            if config is None:
                overrides = (*overrides, f"train.steps={args.steps}")
            env = {**os.environ, "AGENTRL_CACHE": str(base / name / "cache")}
            (base / name).mkdir(parents=True, exist_ok=True)
            progress(f"{name}: dry run")
            dry_s, dry = dry_run(config, overrides, env)
            progress(f"{name}: {dry} in {dry_s:.1f} s; training")
            run = train(config, overrides, base / name / "run", env)
            progress(f"{name}: exit {run['rc']} in {run['total_s']:.0f} s")
            scores = (f"{run['before']:.3f} -> {run['after']:.3f}", f"{run['after'] - run['before']:+.3f}") \
                if "after" in run else ("-", "stopped" if run["rc"] == 2 else f"exit {run['rc']}")
            verdict = "-" if run["verdict_s"] is None else f"{run['verdict_s']:.0f}"
            rows.append([name, f"{dry_s:.1f}", dry, verdict, f"{run['total_s']:.0f}", *scores])
            if run["error"]:
                messages.append(f"{name}: {run['error']}")
    print(table(["task", "dry run s", "dry-run verdict", "warm-start verdict s", "run s", "held-out", "gain"], rows,
                "a newcomer's tasks on the embedded default, default teacher settings, each from an empty cache"))
    for line in messages:
        print(line)


if __name__ == "__main__":
    main()
