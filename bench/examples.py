"""Every shipped example, run as its README gives it, one after another: held-out score before and after
RL, and the minutes each took (model preparation included when the cache is cold).

    python bench/examples.py                                  # all of them (about an hour on 2 cores)
    python bench/examples.py --only arithmetic,custom_env     # some
    python bench/examples.py --cache /tmp/cold                # from an empty AGENTRL_CACHE
    python bench/examples.py --only reasoning_gym --seeds 0,1,2   # the spread over seeds (train.seed, engine.seed)

Each run is a subprocess, `python -m agentrl.train --config examples/agents/<name>.yaml` (the tool
examples with the reference tool server or the code sandbox started first, as the README says), or `bash
examples/pipeline/run.sh`; its summary.json gives the scores. The examples run one at a time: two at
once on 2 cores would each take about twice as long. The table goes to stdout (markdown, for the
README); progress and each run's log tail on failure go to stderr. With `--seeds`, each example runs once per
seed with `train.seed=S engine.seed=S` (the learner's and the sampler's; the tasks and the held-out set stay
the same), one row per run, then the range of the gains; the pipeline has no seed setting and runs once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import ROOT, add_overrides, print_host, progress, run_logged, serve

TOOL_PORT = 8765
SANDBOX_PORT = 8766


@dataclass(frozen=True)
class Example:
    name: str
    what: str  # what it is there to show
    tool_server: bool = False  # the reference tool server must be up (rewards.servers.tools)
    sandbox: bool = False  # the code sandbox must be up (rewards.servers.sandbox)

    @property
    def config(self) -> str:
        return f"examples/agents/{self.name}.yaml"


EXAMPLES = (
    Example("guess_number", "the main job: multi-turn, embedded default model"),
    Example("custom_env", "a user-written Env with its own warm start"),
    Example("arithmetic", "single-turn verifiable env, rule reward"),
    Example("calculator", "multi-turn tool use through a remote tool server", tool_server=True),
    Example("openai_agent", "plain openai agent code through the OpenAI endpoint", tool_server=True),
    Example("openenv", "an OpenEnv server's environment"),
    Example("reasoning_gym", "a reasoning-gym dataset on SmolLM2-135M"),
    Example("verifiers", "a verifiers environment through the OpenAI endpoint"),
    Example("smollm2_quiz", "a real pretrained model (SmolLM2-135M) on a multi-turn quiz"),
    Example("code_interpreter", "multi-turn, a Python interpreter in the code sandbox as the tool", sandbox=True),
    Example("programming", "SmolLM2-135M writes functions, rewarded by hidden tests run in the sandbox", sandbox=True),
)
PIPELINE = "pipeline"  # examples/pipeline/run.sh: SFT -> RM -> PPO


def run_example(ex: Example, out: Path, env: dict[str, str], extra: list[str]) -> tuple[float | None, float]:
    """(held-out score before, after); before is None when the run skipped it (train.eval_before=false)."""
    cmd = [sys.executable, "-m", "agentrl.train", "--config", ex.config, f"train.out_dir={out}", *extra]
    with contextlib.ExitStack() as servers:
        if ex.tool_server:
            servers.enter_context(serve("rewards.servers.tools", TOOL_PORT, env=env))
        if ex.sandbox:
            servers.enter_context(serve("rewards.servers.sandbox", SANDBOX_PORT, env=env))
        run_logged(cmd, out.with_suffix(".log"), env)
    summary = json.loads((out / "summary.json").read_text())
    before = summary.get("eval_before")
    return None if before is None else before["score"], summary["eval_after"]["score"]


def run_pipeline(out: Path, env: dict[str, str]) -> tuple[float, float]:
    """The pipeline's own held-out eval (examples/pipeline/run.sh's eval stages): after SFT, after PPO."""
    # run.sh's stages on this interpreter, as the other examples run (its own default, .venv/bin/python,
    # is missing in a git worktree of the repo).
    run_logged(["bash", "examples/pipeline/run.sh"], out.with_suffix(".log"),
               {"PYTHON": sys.executable, **env, "OUT": str(out), "FRESH": "1"})  # no stage reused from an earlier bench
    before = json.loads((out / "eval_sft.json").read_text())["score"]
    after = json.loads((out / "eval_ppo.json").read_text())["score"]
    return before, after


def main() -> None:
    names = [ex.name for ex in EXAMPLES] + [PIPELINE]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(names)}")
    ap.add_argument("--out", default="runs/bench_examples", help="where the runs are written")
    ap.add_argument("--cache", default="", help="AGENTRL_CACHE for the runs (empty folder = cold cache)")
    ap.add_argument("--seeds", default="", help="comma-separated seeds: each example once per seed")
    add_overrides(ap)
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",") if x] or [None]
    chosen = [n for n in (args.only.split(",") if args.only else names) if n]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        ap.error(f"unknown example(s) {unknown}; known: {names}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.cache:
        env["AGENTRL_CACHE"] = str(Path(args.cache).resolve())
    out_root = Path(args.out).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    rows, gains = [], {}
    for name, seed in [(n, s) for n in chosen for s in ([None] if n == PIPELINE else seeds)]:
        label = name if seed is None else f"{name} seed {seed}"
        out = out_root / (name if seed is None else f"{name}-seed{seed}")
        progress(f"{label}: running (log {out.with_suffix('.log')})")
        t0 = time.perf_counter()
        try:
            if name == PIPELINE:
                before, after = run_pipeline(out, env)
            else:
                ex = next(e for e in EXAMPLES if e.name == name)
                seeded = [] if seed is None else [f"train.seed={seed}", f"engine.seed={seed}"]
                before, after = run_example(ex, out, env, [*args.overrides, *seeded])
            minutes = (time.perf_counter() - t0) / 60
            shown, gain = "–", ""  # the run skipped its before-score (train.eval_before=false): no gain either
            if before is not None:
                shown, gain = f"{before:.3f}", f"{after - before:+.3f}"
                gains.setdefault(name, []).append(after - before)
            rows.append((label, shown, f"{after:.3f}", gain, f"{minutes:.1f}"))
            progress(f"{label}: {shown} -> {after:.3f} in {minutes:.1f} min")
        except Exception as exc:  # one failing example does not hide the others' numbers
            minutes = (time.perf_counter() - t0) / 60
            rows.append((label, "failed", "failed", "", f"{minutes:.1f}"))
            progress(f"{label}: FAILED: {exc}")
    print("| example | held-out before | after | gain | minutes |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if len(seeds) > 1:
        print()
        for name, g in gains.items():
            print(f"{name}: gain {min(g):+.3f} to {max(g):+.3f} over {len(g)} finished run(s)")


if __name__ == "__main__":
    print_host()
    main()
