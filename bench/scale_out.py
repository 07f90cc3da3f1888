"""Scale-out: rollout tokens/s with 2 vLLM engines vs 1, and wall-clock to a held-out score, async vs sync.

    python bench/scale_out.py [--model default] [--episodes 256] [--rounds 2] [--steps 100] [--deltas 0.01,0.02,0.03]
                              [--seeds 0,1] [--out DIR [--reuse]] [--extra KEY=VALUE ...]

The workload is long-tailed and multi-turn: guess-the-number with up to 16 turns (`max_turns: 16`),
a reward of 1 - turn_penalty * (t - 1) for finding the number at turn t, so both how often and how
fast count. A weak policy wanders, so episode lengths spread from 1 to 16 turns; the histogram of the
measured episodes is printed.

Part 1: the same seeded episodes (`RolloutPool.evaluate`) on a Ray fleet of 1 engine, then of 2
  (each engine pinned to its own core), `--rounds` times each after a warm-up round: generated
  tokens/s per round and the ratio of the medians.
Part 2: two training runs of the real CLI from the same model on this workload, `max_staleness: 0`
  (synchronous: generation waits for every step and every push) and `max_staleness: 4` (asynchronous;
  both with the shipped off-policy defaults, see WORKLOAD), evaluated every `--eval-every` steps on the same held-out tasks. Prints
  both eval curves, and for each target (the warm start's score + each of `--deltas`) the wall-clock
  from the start of training until each run's held-out score first reaches it, with the ratio
  sync / async (the speed-up) where both do; and both runs' final scores. With several `--seeds`
  (engine sampling and learner seed; the held-out tasks stay the same) each seed gets its own pair of
  runs and table, then the median speed-up per target over the seeds where both runs reached it.
  `--out DIR` keeps every run's folder (metrics.jsonl, summary.json) for diagnosis.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import MODEL_HELP, ROOT, median, print_host, progress, resolve_model, run_uvloop, table
from agentrl.utils.files import read_jsonl

ENV_KWARGS = {"max_turns": 16, "turn_penalty": 1 / 16}
# Both runs use the shipped off-policy defaults (decoupled PPO, truncated IS, algo.trust_region=clip).
# Before the trust region, decoupled mode with one optimizer step per batch had no bound on how far a
# 4-step-stale batch pushes the policy past mu (the ratio against pi_prox is 1 where the gradient is
# taken) and collapsed here within 20 steps; this benchmark then ran algo.mode=bypass with algo.dual_clip=3.
# bench/staleness.py compares those recipes with the default.
SMOOTH = 3  # time to target on the mean of this many consecutive evals (robust to one noisy eval)
# The estimator: PPO's GAE with a critic (`algo.advantage=gae`, the critic initialised from the actor with a
# new value head, trained alone for the first 5 steps), four optimizer steps a batch, each bounded to a KL of
# 0.05 from the weights before it (`learner.mini_batches=4 learner.max_step_kl=0.05`). GRPO spreads one
# episode-level advantage over up to 16 turns, so a good late guess in a long episode is pushed down with the
# wasted ones before it: on this workload GRPO stayed flat on-policy (0.743 -> 0.715 in 60 steps, seed 0).
# turn_grpo (a baseline per turn over the group's episodes that reached it) learned, +0.035 over the warm
# start in 120 steps (seeds 0-2); a critic judges every guess against the value of the state it was made in
# and gained +0.0496 with one step a batch. Two steps a batch without a bound gained more at staleness 0 and 8
# but collapsed on one seed of three at 2 and at 4: a batch's first step at times moved the policy by a KL of
# 0.3-1.0 (median 0.0007). With the bound four steps gain +0.056 to +0.059 at every staleness 0-16, at 1.4x the
# seconds a step of one: docs/benchmarks.md, "Staleness".
WORKLOAD = ["env.import_path=envs.guess_number:GuessNumberEnv", "env.kwargs.max_turns=16",
            f"env.kwargs.turn_penalty={ENV_KWARGS['turn_penalty']}", "rollout.max_turns=16",
            "rollout.max_tokens_per_turn=6", "engine.max_model_len=512", "algo.advantage=gae",
            "learner.freeze_actor_steps=5", "learner.mini_batches=4", "learner.max_step_kl=0.05"]


async def fleet_round_rates(model: str, engines: int, episodes: int, rounds: int) -> tuple[list[float], Counter]:
    """Generated tokens/s of `rounds` timed rounds of the same seeded episodes on a fleet of `engines`."""
    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.run.cluster import connect, disconnect
    from agentrl.config import ClusterConfig, EngineConfig, RolloutConfig
    from agentrl.rollout.episode import EpisodeSpec
    from agentrl.rollout.fleet import EngineFleet
    from agentrl.rollout.pool import RolloutPool
    from envs.guess_number import GuessNumberEnv

    cluster = ClusterConfig(backend="ray", engines=engines, engine_num_cpus=1, learner_num_cpus=0)
    connect(cluster)
    fmt = ChatFormat(load_tokenizer(model))
    fleet = EngineFleet.ray(model, EngineConfig(), fmt.eos_id, cluster)
    await fleet.start()
    try:
        spec = EpisodeSpec(GuessNumberEnv, ENV_KWARGS, fmt, RolloutConfig(max_turns=16, max_tokens_per_turn=6,
                                                                          max_concurrency=episodes), 512)
        pool = RolloutPool(fleet, spec)
        tasks = GuessNumberEnv.make_tasks(episodes, 0, "bench")
        rates, turns = [], Counter()
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            eps = await pool.evaluate(tasks, seed=r)
            rate = sum(e.n_generated for e in eps) / (time.perf_counter() - t0)
            if r:  # round 0 warms the engines up
                rates.append(rate)
                turns.update(len(e.turns) for e in eps)
            progress(f"{engines} engine(s), round {r}: {rate:.0f} tok/s" + (" (warm-up)" if not r else ""))
        return rates, turns
    finally:
        await fleet.shutdown()
        disconnect()


def train_run(model: str, staleness: int, seed: int, steps: int, eval_every: int, out: Path,
              extra: list[str]) -> dict:
    """One CLI run; returns its summary and step records (each with `elapsed_s`, some with `eval_score`)."""
    cmd = [sys.executable, "-m", "agentrl.train", "--config", "examples/agents/guess_number.yaml",
           f"model.path={model}", f"train.out_dir={out}", f"train.steps={steps}",
           f"train.eval_every={eval_every}", f"buffer.max_staleness={staleness}", "train.save_model=false",
           f"engine.seed={seed}", f"train.seed={seed}", *WORKLOAD, *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    progress(f"training, max_staleness {staleness}, seed {seed}: {' '.join(cmd[3:])}")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    return load_run(out)


def load_run(out: Path) -> dict:
    records = [row for _, row in read_jsonl(out / "metrics.jsonl")]
    return {"summary": json.loads((out / "summary.json").read_text()), "records": records}


def time_to(records: list[dict], target: float, window: int = 1) -> float | None:
    """Elapsed seconds at the first eval where the mean of the last `window` evals reaches `target`
    (window > 1: one lucky eval of 128 sampled episodes, whose standard error is ~0.02, does not count)."""
    evals = [r for r in records if r.get("eval_score") is not None]
    for i, r in enumerate(evals):
        last = evals[max(0, i - window + 1):i + 1]
        if len(last) == window and sum(e["eval_score"] for e in last) / window >= target:
            return r["elapsed_s"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help=MODEL_HELP)
    ap.add_argument("--episodes", type=int, default=256, help="part 1: episodes per round")
    ap.add_argument("--rounds", type=int, default=2, help="part 1: timed rounds per fleet size")
    ap.add_argument("--steps", type=int, default=100, help="part 2: learner steps per run")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--deltas", default="0.01,0.02,0.03", help="part 2: targets = warm-start score + each delta")
    ap.add_argument("--skip", choices=["fleet", "train"], help="run one part only")
    ap.add_argument("--extra", nargs="*", default=[], help="part 2: more dotted overrides for both runs")
    ap.add_argument("--seeds", default="0", help="part 2: one pair of runs per seed (engine.seed, train.seed)")
    ap.add_argument("--out", help="part 2: keep the run folders here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="part 2: report the runs already in --out, train nothing")
    args = ap.parse_args()
    model = resolve_model(args.model)

    if args.skip != "fleet":
        one, turns = run_uvloop(fleet_round_rates(model, 1, args.episodes, args.rounds))
        two, _ = run_uvloop(fleet_round_rates(model, 2, args.episodes, args.rounds))
        rows = [[f"{n} engine(s)", " ".join(f"{x:.0f}" for x in rates), f"{median(rates):.0f}"]
                for n, rates in ((1, one), (2, two))]
        print(table(["fleet", "tok/s per round", "median"], rows, f"\nPart 1: {args.episodes} seeded episodes "
                    f"per round, up to 16 turns (turns per episode: {dict(sorted(turns.items()))})"))
        print(f"  2 engines / 1 engine = {median(two) / median(one):.3f}")

    if args.skip != "train":
        seeds = [int(x) for x in args.seeds.split(",")]
        deltas = [float(d) for d in args.deltas.split(",")]
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(args.out) if args.out else Path(tmp)
            ratios = {d: [] for d in deltas}
            for seed in seeds:
                runs = {s: load_run(root / f"seed{seed}-s{s}") if args.reuse else
                        train_run(model, s, seed, args.steps, args.eval_every, root / f"seed{seed}-s{s}", args.extra)
                        for s in (0, 4)}
                for d, r in report_pair(runs, args.steps, args.eval_every, deltas, seed).items():
                    ratios[d].append(r)
        if len(seeds) > 1:
            rows = [[f"+{d:.3f}", " ".join("-" if r is None else f"{r:.2f}" for r in rs),
                     f"{median([r for r in rs if r is not None]):.2f}" if any(r is not None for r in rs) else "-"]
                    for d, rs in ratios.items()]
            print(table(["target", "sync / async per seed", "median (seeds where both reached it)"], rows,
                        f"\nspeed-up (time to the {SMOOTH}-eval mean) over seeds {seeds}"))


def report_pair(runs: dict[int, dict], steps: int, eval_every: int, deltas: list[float],
                seed: int) -> dict[float, float | None]:
    """Print one seed's two eval curves and wall-clock table; returns sync / async per delta."""
    before = runs[0]["summary"]["eval_before"]["score"]
    print(f"\nPart 2, seed {seed}: {steps} steps; held-out eval every {eval_every} steps (step: score @elapsed)")
    for s, run in runs.items():
        print(f"  max_staleness {s}  " + "  ".join(f"{r['step'] + 1}: {r['eval_score']:.3f} @{r['elapsed_s']:.0f}s"
                                                  for r in run["records"] if r.get("eval_score") is not None))
    rows, ratios = [], {}
    for delta in deltas:
        target, row = before + delta, []
        for window in (1, SMOOTH):
            t_sync, t_async = (time_to(runs[s]["records"], target, window) for s in (0, 4))
            ratio = t_sync / t_async if t_sync and t_async else None
            row += ["not reached" if t_sync is None else f"{t_sync:.0f} s",
                    "not reached" if t_async is None else f"{t_async:.0f} s", "-" if ratio is None else f"{ratio:.2f}"]
        ratios[delta] = ratio  # the smoothed one
        rows.append([f"+{delta:.3f} = {target:.3f}", *row])
    print(table(["target (warm start + delta)", "sync: first eval", "async: first eval", "sync / async",
                 f"sync: {SMOOTH}-eval mean", f"async: {SMOOTH}-eval mean", "sync / async"],
                rows, f"\nwall-clock to each target (warm start {before:.3f})"))
    for s, run in runs.items():
        print(f"  max_staleness {s}: final score {run['summary']['eval_after']['score']:.3f}, "
              f"RL time {run['summary']['train']['seconds']:.0f} s")
    steps_s = [runs[s]["summary"]["train"]["seconds"] / steps for s in (0, 4)]
    print(f"  seconds per step: sync {steps_s[0]:.2f}, async {steps_s[1]:.2f} -> {steps_s[0] / steps_s[1]:.2f}x")
    learn = [sum(r["learner_call_s"] for r in runs[s]["records"]) / steps for s in (0, 4)]
    print(f"  learner step: sync {learn[0]:.2f} s, async {learn[1]:.2f} s ({learn[1] / learn[0]:.2f}x slower beside "
          f"vLLM on the same cores). Async cannot step faster than its learner, so its per-step speed-up is "
          f"bounded by sync step / learner step = {steps_s[0] / learn[0]:.2f}x (generation, push and evals "
          f"{steps_s[0] - learn[0]:.2f} s of sync's {steps_s[0]:.2f} s)")
    return ratios


if __name__ == "__main__":
    print_host()
    main()
