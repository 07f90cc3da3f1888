"""Stages before RL on the default task: SFT through the CLI vs the warm start, DPO / KTO on held-out
success, and a PRM's step ranking.

    python bench/stages.py [--parts sft,pref,prm] [--samples 4] [--sweep] [--quick] [--work DIR]

Data: `examples/pipeline/make_data.py` (demos, pairs, kto, prm, prm_eval) in `--work` (a temp folder by
default). Held-out evals are `python -m agentrl.eval --config examples/agents/guess_number.yaml --samples K`
(128 held-out tasks x K seeded samples, the env's reward: 1 when the number is found within 4 guesses);
"+-" is the 95 % interval of the success rate, 1.96 * sqrt(p (1 - p) / episodes).

Part a, SFT parity: `python -m agentrl.sft` on demos.jsonl from the untrained default model with the warm
  start's settings (300 steps of 64, lr 2e-3, 30 warmup steps, cosine to 0, nothing held out) vs the
  default model's own warm start (the same stage loop called by `agentrl.models.default`, rebuilt here in
  a temp cache so both are timed in this run; `--cached-warm` uses the cached one) vs the old warm start
  (a plain torch loop, /root/.cache/agentrl/default-model-78c592adc323, when present). Before training,
  demos.jsonl is checked to tokenise to exactly the warm start's demonstrations.
Part b, DPO and KTO from the default warm start on pairs.jsonl / kto.jsonl, against the warm start itself
  and a control: plain SFT on the chosen episodes (what the preference methods' gain should be read
  against). `--sweep` also runs the settings that were tried and rejected (PREF_SWEEP).
Part c, PRM from the warm start on prm.jsonl, scored on prm_eval.jsonl (other tasks and episodes): the
  mean P(good step) of correct and of wrong steps, and pairwise ranking accuracy, the share of (correct,
  wrong) step pairs where the correct step scores higher (ties half), over all steps of the held-out set
  and within each episode. The warm start itself (never trained on step labels) is the baseline.
  Scores come from `rewards.prm.PRMScorer` when it exists, else straight from the saved model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ROOT, print_host, progress, table

OLD_WARM = Path("/root/.cache/agentrl/default-model-78c592adc323")
EVAL_CONFIG = "examples/agents/guess_number.yaml"

# The warm start's SFT settings (agentrl.models.default.warm_start_config with DefaultModelConfig()):
# 300 steps of 64 demonstrations, 10 % linear warmup to 2e-3, cosine to 0, 5 epochs' worth of rows.
WARM_SFT = ["--max_steps", "300", "--epochs", "5", "--batch_size", "64", "--micro_batch_size", "64", "--lr", "2e-3",
            "--warmup_steps", "30", "--scheduler", "cosine", "--min_lr_ratio", "0", "--eval_fraction", "0",
            "--train.seed", "0"]
PREF_COMMON = ["--batch_size", "32", "--micro_batch_size", "32", "--warmup_steps", "10", "--epochs", "20",
               "--eval_fraction", "0.05"]
# (label, stage, dataset file, settings): what part b runs by default, found by the sweep below.
PREF_RUNS = [
    ("dpo (rpo)", "dpo", "pairs.jsonl", ["--beta", "0.1", "--nll_coef", "1.0", "--lr", "5e-4", "--max_steps", "300"]),
    ("kto", "kto", "kto.jsonl", ["--beta", "1.0", "--undesirable_weight", "0.3", "--lr", "3e-4", "--max_steps", "200"]),
    ("sft on chosen (control)", "sft", "chosen.jsonl", ["--lr", "3e-4", "--max_steps", "200"]),
]
# Tried and rejected: plain DPO and IPO lower held-out success (at lr >= 5e-5 the policy's log-probs of
# chosen and rejected both fall, and the number tokens lose their mass to junk); KTO at equal weights too.
PREF_SWEEP = [
    ("dpo", "dpo", "pairs.jsonl", ["--beta", "0.1", "--lr", "2e-4", "--max_steps", "100"]),
    ("dpo", "dpo", "pairs.jsonl", ["--beta", "0.1", "--lr", "2e-5", "--max_steps", "100"]),
    ("dpo", "dpo", "pairs.jsonl", ["--beta", "0.5", "--lr", "5e-5", "--max_steps", "200"]),
    ("ipo", "dpo", "pairs.jsonl", ["--loss", "ipo", "--beta", "0.1", "--lr", "5e-5", "--max_steps", "200"]),
    ("dpo (rpo)", "dpo", "pairs.jsonl", ["--beta", "0.1", "--nll_coef", "1.0", "--lr", "1e-4", "--max_steps", "100"]),
    ("dpo (rpo)", "dpo", "pairs.jsonl", ["--beta", "0.1", "--nll_coef", "1.0", "--lr", "3e-4", "--max_steps", "200"]),
    ("kto", "kto", "kto.jsonl", ["--beta", "0.1", "--lr", "1e-4", "--max_steps", "200"]),
    ("kto", "kto", "kto.jsonl", ["--beta", "0.1", "--lr", "3e-5", "--max_steps", "200"]),
    ("kto", "kto", "kto.jsonl", ["--beta", "1.0", "--lr", "1e-4", "--max_steps", "200"]),
    ("kto", "kto", "kto.jsonl", ["--beta", "0.1", "--undesirable_weight", "0.2", "--lr", "1e-4", "--max_steps", "200"]),
    ("kto", "kto", "kto.jsonl", ["--beta", "2.0", "--undesirable_weight", "0.3", "--lr", "3e-4", "--max_steps", "300"]),
]
PRM_SETTINGS = ["--lr", "5e-4", "--max_steps", "300", "--epochs", "10", "--batch_size", "32", "--micro_batch_size", "32",
                "--warmup_steps", "30"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true", "VLLM_LOGGING_LEVEL": "ERROR"}


def _run(cmd: list[str], log: Path) -> None:
    """Run a CLI from the repo root, its output in `log`; a failure ends the bench with the command and tail."""
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def stage(name: str, model: str, dataset: Path, out: Path, settings: list[str]) -> dict[str, Any]:
    """`python -m agentrl.<name>` (conversations under "messages"); its summary plus the wall time."""
    cmd = [sys.executable, "-m", f"agentrl.{name}", "--model", model, "--dataset", str(dataset),
           "--messages_key", "messages", "--out", str(out), *settings]
    progress(f"{name}: {' '.join(cmd[3:])}")
    t0 = time.perf_counter()
    _run(cmd, out.with_suffix(".log"))
    summary = json.loads((out / "summary.json").read_text())
    summary["wall_s"] = time.perf_counter() - t0
    last = summary["evals"][-1] if summary["evals"] else summary["final_train"]
    progress(f"{name}: {summary['steps']} steps in {summary['wall_s']:.0f} s; "
             + ", ".join(f"{k} {v:.3f}" for k, v in last.items() if "/" in k))
    return summary


def evaluate(model: str, samples: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """`python -m agentrl.eval` on the held-out tasks; its JSON report."""
    cmd = [sys.executable, "-m", "agentrl.eval", "--config", EVAL_CONFIG, "--model", model,
           "--samples", str(samples), "--json", str(out), *extra]
    _run(cmd, out.with_suffix(".log"))
    report = json.loads(out.read_text())
    progress(f"eval {model}: success {report['success_rate']:.3f}, pass@k "
             + " ".join(f"{k}:{v:.3f}" for k, v in report["pass_at_k"].items()))
    return report


def eval_cells(r: dict[str, Any], samples: int) -> list[str]:
    p, n = r["success_rate"], r["finished"]
    ci = 1.96 * math.sqrt(p * (1 - p) / n) if n else math.nan
    return [f"{r['score']:.3f}", f"{p:.3f} +-{ci:.3f}", f"{r['pass_at_k']['1']:.3f}",
            f"{r['pass_at_k'][str(samples)]:.3f}"]


def check_demos(demos: Path) -> None:
    """demos.jsonl, tokenised as the SFT CLI does, is the warm start's demonstration set (order aside)."""
    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.config import DefaultModelConfig
    from agentrl.config.stages import StageDataConfig
    from agentrl.data.examples import build_sft
    from agentrl.models.default import demonstration_samples, ensure_default_model

    cfg = DefaultModelConfig()
    fmt = ChatFormat(load_tokenizer(str(ensure_default_model(DefaultModelConfig(sft_steps=0)))))
    built = build_sft(StageDataConfig(paths=[str(demos)], messages_key="messages", eval_fraction=0.0), fmt, 0)
    mine = sorted((tuple(s.tokens), tuple(s.mask)) for s in built.train)
    warm = sorted((tuple(s.tokens), tuple(s.mask)) for s in demonstration_samples(cfg, fmt))
    if mine != warm:
        raise SystemExit(f"demos.jsonl does not tokenise to the warm start's demonstrations ({len(mine)} vs {len(warm)})")
    progress(f"demos.jsonl = the warm start's {len(warm)} demonstrations, token for token")


def part_sft(work: Path, samples: int, extra: list[str], cached_warm: bool) -> tuple[str, dict[str, Any]]:
    from agentrl.config import DefaultModelConfig
    from agentrl.models.default import ensure_default_model

    base = str(ensure_default_model(DefaultModelConfig(sft_steps=0)))
    check_demos(work / "data" / "demos.jsonl")
    cli = stage("sft", base, work / "data" / "demos.jsonl", work / "sft_cli", WARM_SFT)
    cached = ensure_default_model(DefaultModelConfig())
    same = True  # the rebuilt warm start is the cached one, whose eval part b can reuse
    if cached_warm:
        warm, warm_s = cached, json.loads((cached / "summary.json").read_text())["seconds"]
    else:
        progress("default model warm start, rebuilt in a temp cache (the same key as the cached one)")
        t0 = time.perf_counter()
        warm = ensure_default_model(DefaultModelConfig(cache_dir=str(work / "cache")))
        warm_s = time.perf_counter() - t0
        diff = _max_diff(warm, cached)
        same = diff == 0.0
        progress(f"warm start built in {warm_s:.0f} s; max |weight - cached weight| = {diff:.2e}")
    models = [("sft CLI, untrained default -> demos.jsonl", str(work / "sft_cli"), f"{cli['wall_s']:.0f}",
               f"{cli['final_train']['train/loss']:.3f}"),
              ("default model warm start (stage loop)", str(warm), f"{warm_s:.0f}",
               f"{json.loads((warm / 'summary.json').read_text())['final_train']['train/loss']:.3f}")]
    if OLD_WARM.is_dir():
        models.append(("old warm start (plain torch loop)", str(OLD_WARM), "-", "-"))
    else:
        progress(f"{OLD_WARM} not found: the old warm start is left out")
    rows, reports = [], {}
    for i, (label, path, secs, loss) in enumerate(models):
        reports[label] = evaluate(path, samples, work / f"eval_sft_{i}.json", extra)
        rows.append([label, secs, loss, *eval_cells(reports[label], samples)])
    print(table(["model", "train s", "last loss", "score", "success", "pass@1", f"pass@{samples}"], rows,
                f"\nPart a: SFT parity (held-out: 128 tasks x {samples} samples)"))
    return str(cached), reports[models[1][0]] if same else None


def part_pref(work: Path, warm: str, warm_report: dict[str, Any] | None, samples: int, extra: list[str],
              sweep: bool) -> None:
    data = work / "data"
    if not (data / "chosen.jsonl").exists():
        rows = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
        (data / "chosen.jsonl").write_text("".join(json.dumps({"messages": r["chosen"]}) + "\n" for r in rows))
    if warm_report is None:
        warm_report = evaluate(warm, samples, work / "eval_warm.json", extra)
    before = warm_report["success_rate"]
    rows = [["default warm start (before)", "-", "-", "-", *eval_cells(warm_report, samples), "-"]]
    for i, (label, name, dataset, settings) in enumerate(PREF_RUNS + (PREF_SWEEP if sweep else [])):
        summary = stage(name, warm, data / dataset, work / f"pref_{i}", PREF_COMMON + settings)
        report = evaluate(str(work / f"pref_{i}"), samples, work / f"eval_pref_{i}.json", extra)
        last = summary["evals"][-1] if summary["evals"] else {}
        held = last.get("eval/reward_accuracy", last.get("eval/loss"))
        rows.append([label + ("" if i < len(PREF_RUNS) else " (sweep)"),
                     " ".join(s.lstrip("-") for s in settings), f"{summary['wall_s']:.0f}",
                     "-" if held is None else f"{held:.3f}", *eval_cells(report, samples),
                     f"{report['success_rate'] - before:+.3f}"])
    print(table(["model", "settings (batch 32, 10 warmup)", "train s", "pair/row acc", "score", "success",
                 "pass@1", f"pass@{samples}", "d success"], rows,
                f"\nPart b: preference stages from the warm start (held-out: 128 tasks x {samples} samples; "
                "pair/row acc: the stage's held-out implicit-reward accuracy, sft: held-out loss)"))


def prm_metrics(model: str, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean step score of correct and wrong steps; pairwise accuracy over all and within-episode pairs."""
    import numpy as np

    score = _prm_scorer(model)
    good, bad, within, n_within = [], [], 0.0, 0
    for row in rows:
        scores = score(row["messages"])
        g = [s for s, ok in zip(scores, row["label"]) if ok]
        b = [s for s, ok in zip(scores, row["label"]) if not ok]
        good += g
        bad += b
        within += sum((x > y) + 0.5 * (x == y) for x in g for y in b)
        n_within += len(g) * len(b)
    g_, b_ = np.array(good)[:, None], np.array(bad)[None, :]
    pairwise = float((g_ > b_).mean() + 0.5 * (g_ == b_).mean())
    return {"n_good": len(good), "n_bad": len(bad), "good": float(np.mean(good)), "bad": float(np.mean(bad)),
            "pairwise": pairwise, "within": within / max(n_within, 1), "n_within": n_within}


def _prm_scorer(model: str):
    """messages -> step scores: `rewards.prm.PRMScorer`, or the same computation on the saved model."""
    try:
        from agentrl.config.sources import PRMScorerConfig
        from rewards.prm import PRMScorer
    except ImportError:
        PRMScorer = None
    if PRMScorer is not None:
        scorer = PRMScorer(PRMScorerConfig(path=model))
        return lambda messages: scorer.step_scores(scorer.sample(messages))
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.algo.preference import prm_step_scores
    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.config.stages import PRMConfig
    from agentrl.data.steps import prm_sample, reward_token_ids

    fmt = ChatFormat(load_tokenizer(model))
    ids = reward_token_ids(PRMConfig(), fmt)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    @torch.inference_mode()
    def score(messages):
        sample = prm_sample(fmt, messages, None, "episode")
        logits = lm(input_ids=torch.tensor([sample.tokens]), use_cache=False).logits[0, sample.positions]
        return prm_step_scores(logits[:, ids]).tolist()

    return score


def part_prm(work: Path, warm: str) -> None:
    data = work / "data"
    summary = stage("prm", warm, data / "prm.jsonl", work / "prm",
                    PRM_SETTINGS + ["--eval_dataset", str(data / "prm_eval.jsonl")])
    held = [json.loads(line) for line in (data / "prm_eval.jsonl").read_text().splitlines()]
    rows = []
    for label, path, acc in (("default warm start (untrained PRM)", warm, "-"),
                             ("prm stage", str(work / "prm"), f"{summary['evals'][-1]['eval/step_accuracy']:.3f}")):
        m = prm_metrics(path, held)
        progress(f"prm scores of {path}: {m}")
        rows.append([label, acc, f"{m['good']:.3f}", f"{m['bad']:.3f}", f"{m['pairwise']:.3f}", f"{m['within']:.3f}"])
    print(table(["model", "step acc", "mean score correct", "mean score wrong", "pairwise acc", "within-episode"],
                rows, f"\nPart c: PRM ({' '.join(s.lstrip('-') for s in PRM_SETTINGS)}) on prm_eval.jsonl: "
                      f"{len(held)} episodes, {m['n_good']} correct and {m['n_bad']} wrong steps, "
                      f"{m['n_good'] * m['n_bad']} pairs ({m['n_within']} within an episode)"))


def _max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="sft,pref,prm", help="comma-separated subset of sft, pref, prm")
    ap.add_argument("--samples", type=int, default=4, help="held-out samples per task (pass@k up to this)")
    ap.add_argument("--sweep", action="store_true", help="part b: also the rejected settings (PREF_SWEEP)")
    ap.add_argument("--cached-warm", action="store_true", help="part a: the cached warm start, not a timed rebuild")
    ap.add_argument("--quick", action="store_true", help="64 held-out tasks x 2 samples, the cached warm start")
    ap.add_argument("--work", help="keep data, models and logs here (default: a temp folder, removed)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts - {"sft", "pref", "prm"}:
        ap.error(f"--parts: unknown {sorted(parts - {'sft', 'pref', 'prm'})}")
    samples, extra = (2, ["data.eval_tasks=64"]) if args.quick else (args.samples, [])
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-stages-"))
    t0 = time.perf_counter()
    try:
        from agentrl.config import DefaultModelConfig
        from agentrl.models.default import ensure_default_model
        from examples.pipeline.make_data import make

        counts = make(work / "data")
        progress(f"data in {work / 'data'}: {counts}")
        warm, warm_report = str(ensure_default_model(DefaultModelConfig())), None
        if "sft" in parts:
            warm, warm_report = part_sft(work, samples, extra, args.cached_warm or args.quick)
        if "pref" in parts:
            part_pref(work, warm, warm_report, samples, extra, args.sweep)
        if "prm" in parts:
            part_prm(work, warm)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    print_host()
    main()
