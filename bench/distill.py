"""On-policy distillation against RL from the env's reward alone, from the same start: held-out score against
learner steps and minutes, and the steps each needs to reach 90 % of the teacher's held-out score.

    python bench/distill.py [--seeds 0,1,2] [--steps distill=120,rl=300] [--eval-every 10] [--coef 1.0]
                            [--methods distill,rl] [--out DIR [--reuse]] [overrides ...]

The teacher: the embedded default after RL on guess_number, trained once with the README's main job
(`examples/agents/guess_number.yaml`, 400 steps) into DIR/teacher and reused from there. Its held-out
score (summary.json's eval_after, 128 tasks) sets the target: 90 % of it.
The student: the fresh warm start (the embedded default, as every example starts), per seed:
  distill: examples/agents/distill.yaml: the per-token reverse KL to the teacher is the advantage
           (algo.teacher placement learner, env_advantage none: the env's reward is logged, not trained on);
  rl:      examples/agents/guess_number.yaml: GRPO on the env's reward, the shipped default.
Each run is the real CLI with `engine.seed` = `train.seed` = the seed, evaluated on the same 128 held-out
tasks every `--eval-every` steps. Printed: each run's curve (steps: score @minutes), then per method and seed
the final score, the learner steps and minutes to the target (first eval at or above it, and the first
where the mean of 3 consecutive evals is), and the ratio of distillation's steps to RL's. Dotted `overrides`
(e.g. `learner.lr=1e-3`) go to every student run, both methods alike; the teacher is trained without them.
`--out DIR` keeps every run; a run whose summary.json is there is not trained again (a long matrix runs in
parts), `--reuse` trains nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ROOT, add_overrides, print_host, progress, run_logged, table
from bench.scale_out import SMOOTH, load_run

CONFIGS = {"distill": "examples/agents/distill.yaml", "rl": "examples/agents/guess_number.yaml"}
TARGET_SHARE = 0.9


def train(cmd_tail: list[str], out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    out.mkdir(parents=True, exist_ok=True)
    run_logged([sys.executable, "-m", "agentrl.train", f"train.out_dir={out}", *cmd_tail], out / "train.log", env)


def teacher(root: Path, reuse: bool) -> tuple[Path, float]:
    """(the teacher's folder, its held-out score): the README's main job, trained once."""
    out = root / "teacher"
    if not (out / "summary.json").is_file():
        if reuse:
            raise SystemExit(f"--reuse: no teacher in {out}")
        progress("teacher: the README's main job (examples/agents/guess_number.yaml, 400 steps)")
        train(["--config", CONFIGS["rl"], "train.save_model=true"], out)
    return out / "model", load_run(out)["summary"]["eval_after"]["score"]


def student(root: Path, method: str, seed: int, steps: int, eval_every: int, model: Path, coef: float,
            reuse: bool, overrides: list[str]) -> dict:
    out = root / f"{method}-seed{seed}"
    if not (out / "summary.json").is_file():
        if reuse:
            raise SystemExit(f"--reuse: no run in {out}")
        progress(f"{method} / seed {seed}: {steps} steps")
        extra = [f"algo.teacher={{model: {model}, coef: {coef}}}"] if method == "distill" else []
        train(["--config", CONFIGS[method], f"train.steps={steps}", f"train.eval_every={eval_every}",
               "train.save_model=false", f"engine.seed={seed}", f"train.seed={seed}", *extra, *overrides], out)
    return load_run(out)


def curve(run: dict) -> list[tuple[int, float, float]]:
    """(learner steps, held-out score, minutes) from the warm start (0, before RL) to the last eval."""
    points = [(0, run["summary"]["eval_before"]["score"], 0.0)]
    points += [(r["step"] + 1, r["eval_score"], r["elapsed_s"] / 60) for r in run["records"]
               if r.get("eval_score") is not None]
    return points


def reached(points: list[tuple[int, float, float]], target: float, window: int) -> tuple[int, float] | None:
    """(steps, minutes) at the first eval where the mean of the last `window` evals is >= target."""
    for i in range(len(points)):
        last = points[max(0, i - window + 1):i + 1]
        if len(last) == window and sum(p[1] for p in last) / window >= target:
            return points[i][0], points[i][2]
    return None


def report(runs: dict[tuple[str, int], dict], teacher_score: float) -> None:
    target = TARGET_SHARE * teacher_score
    print(f"teacher held-out score {teacher_score:.3f}; target {TARGET_SHARE:.0%} of it = {target:.3f}")
    for (method, seed), run in runs.items():
        print(f"  {method:7s} seed {seed}: " + "  ".join(f"{s}: {v:.3f} @{m:.1f}m" for s, v, m in curve(run)))
    rows, steps = [], {}
    for (method, seed), run in runs.items():
        points = curve(run)
        one, smooth = reached(points, target, 1), reached(points, target, SMOOTH)
        steps.setdefault(method, []).append(smooth[0] if smooth else None)
        rows.append([method, seed, f"{points[0][1]:.3f}", f"{points[-1][1]:.3f}", points[-1][0],
                     *(f"{r[0]} / {r[1]:.1f}" if r else "not reached" for r in (one, smooth))])
    print(table(["method", "seed", "warm start", "final", "steps run", "to target: steps / min",
                 f"{SMOOTH}-eval mean: steps / min"], rows, title="\nsteps and minutes to 90 % of the teacher"))
    if "distill" in steps and "rl" in steps:
        d, r = steps["distill"], steps["rl"]
        if None in d or None in r:
            print("ratio distill / rl steps: not every run reached the target (see the table)")
        else:
            ratio = statistics.mean(d) / statistics.mean(r)
            print(f"mean steps to the target ({SMOOTH}-eval mean): distill {statistics.mean(d):.0f}, rl "
                  f"{statistics.mean(r):.0f}; ratio {ratio:.2f} (goal <= 0.33)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default="distill,rl")
    ap.add_argument("--steps", default="distill=120,rl=300", help="learner steps per run, per method")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--coef", type=float, default=1.0, help="algo.teacher.coef")
    ap.add_argument("--out", help="keep runs here (and resume from them); default: a temporary folder")
    ap.add_argument("--reuse", action="store_true", help="train nothing: report the runs in --out")
    add_overrides(ap, "every student run")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="agentrl-distill-"))
    steps = {k: int(v) for k, v in (kv.split("=") for kv in args.steps.split(","))}
    model, score = teacher(root, args.reuse)
    runs = {(m, s): student(root, m, s, steps[m], args.eval_every, model, args.coef, args.reuse,
                            args.overrides)
            for m in args.methods.split(",") for s in (int(x) for x in args.seeds.split(","))}
    report(runs, score)


if __name__ == "__main__":
    print_host()
    main()
