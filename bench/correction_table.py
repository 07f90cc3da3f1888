"""Off-policy corrections side by side: the default multi-turn task at a large staleness bound,
the same step budget, three ways of handling behaviour/proximal mismatch:

  (a) none             bypass mode, no importance weight: vLLM's mu is the PPO "old" policy
  (b) decoupled + TIS  learner-recomputed pi_prox, token weight pi_prox / mu truncated at algo.correction.high
  (c) decoupled + seq  pi_prox, sequence-level weight (geometric mean) masked outside [algo.correction.low, .high]

Each (config, seed) is one `python -m agentrl.train` run, one after another (never concurrently:
the machine's cores are the measurement). Prints the held-out eval score before and after RL per
run and the mean per config.

    python bench/correction_table.py --steps 250 --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "(a) no correction": ["algo.mode=bypass", "algo.correction=none"],
    "(b) decoupled + TIS": ["algo.mode=decoupled", "algo.correction={type: tis, level: token}"],
    "(c) decoupled + sequence mask": ["algo.mode=decoupled", "algo.correction={type: mask, level: sequence}"],
}


def run(name: str, overrides: list[str], seed: int, args: argparse.Namespace) -> dict:
    out = Path(args.out) / f"{name.split()[0].strip('()')}-seed{seed}"
    cmd = [sys.executable, "-m", "agentrl.train", "--config", "examples/agents/guess_number.yaml",
           f"train.steps={args.steps}", f"buffer.max_staleness={args.staleness}", f"engine.seed={seed}",
           f"train.seed={seed}", f"learner.mini_batches={args.mini_batches}", "train.eval_every=0",
           "train.save_model=false", f"train.out_dir={out}", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "CI": "true"}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} seed {seed} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"before": summary["eval_before"]["score"], "after": summary["eval_after"]["score"],
            "stale_max": summary["train"]["max_staleness_seen"], "seconds": time.perf_counter() - t0,
            "corrected_frac": sum(r.get("policy/is_corrected_frac", 0.0) for r in records) / len(records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument("--mini-batches", type=int, default=2, help="optimizer steps per batch (PPO epochs)")
    parser.add_argument("--out", default="runs/correction_table")
    parser.add_argument("--only", nargs="*", help="config labels to run, e.g. a b")
    args = parser.parse_args()
    rows = []
    for name, overrides in CONFIGS.items():
        if args.only and name[1] not in args.only:
            continue
        for seed in args.seeds:
            res = run(name, overrides, seed, args)
            rows.append((name, seed, res))
            print(f"{name:32s} seed {seed}: eval {res['before']:.3f} -> {res['after']:.3f} "
                  f"(max staleness {res['stale_max']}, corrected {res['corrected_frac']:.3f}, "
                  f"{res['seconds']:.0f}s)", flush=True)
    print(f"\nmax_staleness {args.staleness}, {args.steps} steps, mini_batches {args.mini_batches}, "
          f"seeds {args.seeds}")
    print(f"{'config':32s} {'eval after (mean)':>18s} {'gain (mean)':>12s}")
    for name in CONFIGS:
        mine = [r for n, _, r in rows if n == name]
        if mine:
            after = sum(r["after"] for r in mine) / len(mine)
            gain = sum(r["after"] - r["before"] for r in mine) / len(mine)
            print(f"{name:32s} {after:18.3f} {gain:+12.3f}")


if __name__ == "__main__":
    main()
