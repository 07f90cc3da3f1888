"""Staleness: held-out score after a fixed number of steps and wall-clock to targets, per `max_staleness`
and off-policy method, over several seeds, on two workloads. The headline table of docs/benchmarks.md.

    python bench/staleness.py [--workloads long16,default] [--staleness 0,1,2,4,8,16] [--seeds 0,1,2]
                              [--methods default,decoupled_tis,bypass_dual] [--baseline-staleness 4,8]
                              [--steps long16=80,default=150] [--eval-every 15] [--out DIR [--reuse]]
                              [--png staleness.png] [overrides ...]

Workloads (the embedded default model, warm-started as the examples are):
  long16:  bench/scale_out.py's guess-the-number with up to 16 turns and a turn penalty (long-tailed
           episodes: the setting where asynchronous generation pays and stale samples hurt), trained with
           its estimator, `algo.advantage=gae` (PPO with a critic; GRPO does not learn there), four
           optimizer steps a batch each bounded in KL (`learner.mini_batches=4 learner.max_step_kl=0.05`:
           a policy version is one step, so `max_staleness` below 4 trains it on-policy);
  default: the README's main job, examples/agents/guess_number.yaml (up to 4 turns).
Methods (`METHODS`): `default` is what ships (decoupled PPO, truncated IS, `algo.trust_region: clip`);
`decoupled_tis` and `bypass_dual` are the two recipes it replaced; `half_life` (the trust region's bounds
halving every 8 versions of a token's age) and `ess_step` (the loss scaled by the importance weights'
effective sample size, VCPO) are the staleness-aware candidates tried against it. `default` caps generation
at 2 batches ahead of the learner (`buffer.max_ahead_batches: 2`, shipped since 2026-11-29); `uncapped` is
the bound alone, which lets a fast generator run max_staleness batches ahead, so nearly every episode trains
at the bound ("share at the bound" below; it is what `default` was before that date). At
`max_staleness` 0 the methods are the same on-policy update, so only `default` runs there: it is the
reference every row is compared with. Baselines run only at `--baseline-staleness`.

Each run is the real CLI with `engine.seed` = `train.seed` = the seed (the held-out tasks stay the same),
evaluated on the same 128 held-out tasks every `--eval-every` steps. Printed per workload:
  1. held-out score after the last step per seed, its mean, the lowest final-minus-warm-start over the
     seeds (< 0 means some seed ended below its warm start), and the mean minus staleness 0's mean;
  2. wall-clock (seconds from the start of RL) until the held-out score first reaches each target (the
     warm start + each delta) per seed, on one eval and on the mean of 3 consecutive evals (one lucky
     eval of 128 sampled episodes does not count), and the speed-up over staleness 0 of the same seed;
  3. seconds per step and per learner step.
`--out DIR` keeps every run's folder; a run whose summary is already there is not trained again (so a
long matrix can be run in parts), and `--reuse` trains nothing. `--png` draws score against wall-clock.
Dotted `overrides` (e.g. `learner.lr=1e-3`) go to every run after the workload's and the method's settings;
give such a matrix an `--out` of its own, since run folders are named by workload, method, staleness, seed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import MODEL_HELP, ROOT, add_overrides, print_host, progress, resolve_model, table
from bench.scale_out import WORKLOAD as SCALE_OUT_WORKLOAD
from bench.scale_out import SMOOTH, load_run, time_to

OFF_POLICY_KEYS = ("algo.mode", "algo.correction", "algo.trust_region", "algo.dual_clip")
WORKLOADS: dict[str, list[str]] = {
    # the workload's estimator stays (gae); its off-policy settings are the methods' to set
    "long16": [o for o in SCALE_OUT_WORKLOAD if not o.startswith(OFF_POLICY_KEYS)],
    "default": [],
}
DELTAS = {"long16": (0.01, 0.02, 0.03), "default": (0.05, 0.1, 0.15)}
METHODS: dict[str, list[str]] = {
    "default": [],
    "decoupled_tis": ["algo.mode=decoupled", "algo.correction=tis", "algo.trust_region=none"],
    "bypass_dual": ["algo.mode=bypass", "algo.dual_clip=3", "algo.trust_region=none"],
    "half_life": ["algo.trust_region={type: clip, half_life: 8}"],
    "ess_step": ["algo.correction={type: tis, ess_step: true}"],
    "uncapped": ["buffer.max_ahead_batches=null"],
}


def run_dir(root: Path, workload: str, method: str, staleness: int, seed: int) -> Path:
    return root / f"{workload}-{method}-s{staleness}-seed{seed}"


def train(model: str, workload: str, method: str, staleness: int, seed: int, steps: int, eval_every: int,
          out: Path, overrides: list[str]) -> None:
    cmd = [sys.executable, "-m", "agentrl.train", "--config", "examples/agents/guess_number.yaml",
           f"model.path={model}", f"train.out_dir={out}", f"train.steps={steps}", f"train.eval_every={eval_every}",
           f"buffer.max_staleness={staleness}", "train.save_model=false", f"engine.seed={seed}",
           f"train.seed={seed}", *WORKLOADS[workload], *METHODS[method], *overrides]
    progress(f"{workload} / {method} / max_staleness {staleness} / seed {seed}: {steps} steps")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}\n{proc.stderr[-4000:]}")


def plan(args) -> list[tuple[str, str, int, int]]:
    """(workload, method, staleness, seed) of every run: baselines only at their staleness, none at 0."""
    runs = []
    for workload in args.workloads:
        for method in args.methods:
            for s in args.staleness:
                if (s == 0 and method != "default") or (method != "default" and s not in args.baseline_staleness):
                    continue
                runs += [(workload, method, s, seed) for seed in args.seeds]
    return runs


def ordered_settings(runs: dict[tuple[str, int, int], dict]) -> list[tuple[str, int]]:
    """The (method, staleness) pairs that ran, the shipped default first, then by name and staleness."""
    return sorted({(m, s) for m, s, _ in runs}, key=lambda k: (k[0] != "default", k[0], k[1]))


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def report(workload: str, runs: dict[tuple[str, int, int], dict], deltas: tuple[float, ...], steps: int) -> None:
    seeds = sorted({seed for _, _, seed in runs})
    ref = [runs[("default", 0, seed)] for seed in seeds if ("default", 0, seed) in runs]
    ref_mean = statistics.mean(r["summary"]["eval_after"]["score"] for r in ref) if ref else None
    settings = ordered_settings(runs)
    rows = []
    for (method, s) in settings:
        got = [runs[(method, s, seed)] for seed in seeds if (method, s, seed) in runs]
        final = [r["summary"]["eval_after"]["score"] for r in got]
        gain = [r["summary"]["eval_after"]["score"] - r["summary"]["eval_before"]["score"] for r in got]
        mean = statistics.mean(final)
        rows.append([method, s, " ".join(f"{x:.3f}" for x in final), f"{mean:.3f}", f"{min(gain):+.3f}",
                     "-" if ref_mean is None or s == 0 else f"{mean - ref_mean:+.3f}"])
    # every run evaluates its warm start; a matrix run without staleness 0 shows its first run's per seed
    warm_runs = ref or [next(r for (_, _, sd), r in sorted(runs.items()) if sd == seed) for seed in seeds]
    warm = " ".join(f"{r['summary']['eval_before']['score']:.3f}" for r in warm_runs)
    print(table(["method", "max_staleness", "held-out after (per seed)", "mean", "min(after - before)",
                 "mean - staleness 0"], rows,
                f"\n{workload}: held-out score after {steps} steps, seeds {seeds} (warm start per seed: {warm})"))
    rows = []
    for (method, s) in settings:
        for d in deltas:
            row = [method, s, f"+{d:.2f}"]
            for window in (1, SMOOTH):
                times, ratios = [], []
                for seed in seeds:
                    if (method, s, seed) not in runs:
                        continue
                    target = runs[(method, s, seed)]["summary"]["eval_before"]["score"] + d
                    t = time_to(runs[(method, s, seed)]["records"], target, window)
                    ref = runs.get(("default", 0, seed))
                    t0 = time_to(ref["records"], target, window) if ref else None
                    times.append(fmt(t, ".0f"))
                    ratios.append(None if not (t and t0) else t0 / t)
                reached = [r for r in ratios if r is not None]
                row += [" ".join(times), " ".join(fmt(r, ".2f") for r in ratios),
                        f"{min(reached):.2f} ({len(reached)}/{len(ratios)})" if reached else f"- (0/{len(ratios)})"]
            rows.append(row)
    print(table(["method", "max_staleness", "target", "s to first eval >= target", "staleness 0 / this",
                 "min (seeds with both)", f"s to {SMOOTH}-eval mean >= target", "staleness 0 / this",
                 "min (seeds with both)"], rows,
                f"\n{workload}: wall-clock from the start of RL to the target (warm start + delta), per seed"))
    rows = []
    for (method, s) in settings:
        got = [runs[(method, s, seed)] for seed in seeds if (method, s, seed) in runs]
        step_s = statistics.mean(r["summary"]["train"]["seconds"] / steps for r in got)
        learn_s = statistics.mean(sum(x["learner_call_s"] for x in r["records"]) / steps for r in got)
        ages = [age for r in got for age in trained_ages(r["records"])]
        rows.append([method, s, f"{step_s:.2f}", f"{learn_s:.2f}", f"{statistics.mean(ages):.2f}",
                     f"{sum(a == s for a in ages) / len(ages):.2f}"])
    print(table(["method", "max_staleness", "seconds per step", "learner seconds per step",
                 "mean trained staleness", "share at the bound"], rows,
                f"\n{workload}: time per step and the staleness trained (episodes, mean over seeds)"))


def trained_ages(records: list[dict]) -> list[int]:
    """Every trained episode's staleness (learner version minus its oldest token's), from each step's
    `staleness_hist`: what a bound of max_staleness actually trained at."""
    return [int(age) for r in records for age, n in r.get("staleness_hist", {}).items() for _ in range(n)]


def draw(path: str, workloads: dict[str, dict]) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5 * len(workloads), 4.5), dpi=110)
    for i, (workload, runs) in enumerate(workloads.items()):
        ax = fig.add_subplot(1, len(workloads), i + 1)
        keys = ordered_settings(runs)
        for j, key in enumerate(keys):
            color = f"C{j % 10}"
            for n, seed in enumerate(sorted(seed for m, s, seed in runs if (m, s) == key)):
                recs = runs[(*key, seed)]["records"]
                pts = [(0.0, runs[(*key, seed)]["summary"]["eval_before"]["score"])]
                pts += [(r["elapsed_s"] / 60, r["eval_score"]) for r in recs if r.get("eval_score") is not None]
                ax.plot(*zip(*pts), color=color, alpha=0.7, lw=1.2,
                        label=f"{key[0]}, staleness {key[1]}" if n == 0 else None)
        ax.set_title(f"{workload}: held-out score vs wall-clock")
        ax.set_xlabel("minutes of RL")
        ax.set_ylabel("held-out score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"\nfigure: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--model", default="default", help=MODEL_HELP)
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["long16", "default"])
    ap.add_argument("--staleness", type=ints, default=[0, 1, 2, 4, 8, 16])
    ap.add_argument("--seeds", type=ints, default=[0, 1, 2])
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    ap.add_argument("--baseline-staleness", type=ints, default=[4, 8])
    ap.add_argument("--steps", default="long16=80,default=150", help="learner steps per run, per workload")
    ap.add_argument("--eval-every", type=int, default=15)
    ap.add_argument("--out", help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="report the runs already in --out, train nothing")
    ap.add_argument("--png", help="write the score-vs-wall-clock figure here")
    add_overrides(ap, "every run")
    args = ap.parse_args()
    unknown = [w for w in args.workloads if w not in WORKLOADS] + [m for m in args.methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown workload or method {unknown}; workloads {list(WORKLOADS)}, methods {list(METHODS)}")
    steps = {k: int(v) for k, v in (kv.split("=") for kv in args.steps.split(","))}
    model = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        todo = plan(args)
        for n, (workload, method, s, seed) in enumerate(todo):
            out = run_dir(root, workload, method, s, seed)
            if not args.reuse and not (out / "summary.json").exists():
                progress(f"run {n + 1}/{len(todo)}")
                train(model, workload, method, s, seed, steps[workload], args.eval_every, out,
                      args.overrides)
        by_workload: dict[str, dict] = {}
        for workload, method, s, seed in todo:
            out = run_dir(root, workload, method, s, seed)
            if (out / "summary.json").exists():
                by_workload.setdefault(workload, {})[(method, s, seed)] = load_run(out)
        for workload, runs in by_workload.items():
            report(workload, runs, DELTAS[workload], steps[workload])
        if args.png and by_workload:
            draw(args.png, by_workload)


if __name__ == "__main__":
    print_host()
    main()
