"""Learner tokens/s and padding on ragged agent batches: padded row-count micro-batches (today's default) vs
token-budget micro-batches vs packed sequences, side by side on the same batch and model.

    python bench/packing.py [--models default,smollm2-135m-instruct] [--batch 8] [--steps 1] [--budget 4096]
                            [--rollouts RUN_DIR[,RUN_DIR...]]

Profile (b): episode lengths log-normal over a 20x spread (64 to 1,280 tokens: median ~290), a fifth of each
the prompt, then two generated turns with an env reply between them (the env tokens unscored), groups of 4.
Each side is a `Learner` on the same weights (`learner.micro_batch_size` rows padded to the batch's longest
row; `learner.micro_batch_tokens` = --budget; the same with `learner.pack_sequences`); algo defaults
(decoupled, one optimizer step: pi_prox comes from the training pass, so a step is one forward + backward).
Profile (a), `--rollouts`: the episodes a real run recorded (its rollouts.jsonl, `train.save_rollouts`; by
default a sample of each step's groups), step k's trainable episodes as the k-th timed batch, each run's steps
in turn; token ids are taken modulo the model's vocabulary, so any model can be timed on a run's lengths and
loss masks (what decides padding and compute), whatever model recorded it.
Each batch runs on every side in turn after a short warm-up step each, so other jobs' load lands on all of
them. tokens/s: all timed batches' real tokens (attention mask) / their summed step time; step s: the mean;
padding: tokens computed / real tokens over all batches (the learner's `padding_ratio` metric). Goal: SmolLM2 packed or budget
>= 1.5x padded.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import print_host, progress, resolve_model, table


def agent_batch(vocab: int, pad_id: int, batch: int, seed: int, low: int = 64, high: int = 1280):
    """`batch` episodes, lengths log-normal between low and high (clipped), ragged multi-turn ledgers."""
    from agentrl.types import Episode, TrainBatch

    rng = random.Random(seed)
    mu, sigma = math.log(math.sqrt(low * high)), math.log(high / low) / 4  # +-2 sigma spans the spread
    episodes = []
    for i in range(batch):
        n = int(min(max(rng.lognormvariate(mu, sigma), low), high))
        prompt, env = n // 5, n // 10
        gen1 = (n - prompt - env) // 2
        gen2 = n - prompt - env - gen1
        ep = Episode(task_id=f"t{i // 4}", group_id=i // 4, reward=float(i % 2))
        tok = lambda k: [rng.randrange(10, vocab - 1) for _ in range(k)]  # noqa: E731
        ep.append(tok(prompt), generated=False)
        for gen, after in ((gen1, env), (gen2, 0)):
            ep.append(tok(gen), generated=True, logprobs=[-rng.uniform(0.5, 3.0) for _ in range(gen)],
                      versions=[0] * gen)
            ep.append(tok(after), generated=False)
        episodes.append(ep)
    return TrainBatch.from_episodes(episodes, None, pad_id)


def recorded_batches(dirs: list[str], vocab: int, pad_id: int) -> list[tuple[str, object]]:
    """(label, TrainBatch) per recorded step of each run folder (or rollouts.jsonl), trainable episodes only."""
    from agentrl.rollout.records import episode_from_record, read_records
    from agentrl.types import TrainBatch

    out = []
    for d in dirs:
        path = Path(d) / "rollouts.jsonl" if Path(d).is_dir() else Path(d)
        steps: dict[int, list] = {}
        for rec in read_records(path):
            ep = episode_from_record(rec)
            if ep.trainable:
                ep.tokens = [t % vocab for t in ep.tokens]
                ep.segments = []  # a segment keeps its own ids: time the current ledgers only
                steps.setdefault(int(rec["step"]), []).append(ep)
        out += [(f"{path.parent.name} step {k}", TrainBatch.from_episodes(eps, None, pad_id))
                for k, eps in sorted(steps.items())]
    if not out:
        raise SystemExit(f"no trainable episodes recorded in {dirs}")
    return out


def build(path: str, args: argparse.Namespace, **cfg):
    import torch

    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    torch.manual_seed(0)
    learner_cfg = LearnerConfig(num_threads=args.threads, lr=1e-6, **cfg)
    return Learner(LearnerSpec(path, learner_cfg, AlgoConfig(), args.batch, total_steps=args.steps + 2))


def run_model(name: str, args: argparse.Namespace) -> list[list[str]]:
    from transformers import AutoConfig

    path = resolve_model(name)
    config = AutoConfig.from_pretrained(path)
    vocab, pad = config.vocab_size, 0
    sides = {"padded": {"micro_batch_size": args.micro_rows},
             "token budget": {"micro_batch_tokens": args.budget},
             "packed": {"micro_batch_tokens": args.budget, "pack_sequences": True}}
    sides = {side: cfg for side, cfg in sides.items() if side.split()[0] in args.sides.split(",")}
    learners = {side: build(path, args, **cfg) for side, cfg in sides.items()}
    warm = agent_batch(vocab, pad, 4, seed=99, low=32, high=64)
    for side, learner in learners.items():
        learner.step(warm)
    if args.rollouts:
        batches = recorded_batches(args.rollouts.split(","), vocab, pad)
        batches = batches[::max(1, len(batches) // args.steps)][:args.steps]  # --steps of them, over the whole run
    else:
        batches = [(f"profile (b) {k}", agent_batch(vocab, pad, args.batch, seed=k)) for k in range(args.steps)]
    # tokens/s over all timed batches (real tokens / seconds), padding over all of them (computed / real)
    seconds = {side: 0.0 for side in sides}
    computed = {side: 0.0 for side in sides}
    tokens = 0
    for label, batch in batches:
        real = int(batch.attention_mask.sum())
        tokens += real
        for side, learner in learners.items():
            t0 = time.perf_counter()
            (m,) = learner.step(batch)
            seconds[side] += time.perf_counter() - t0
            computed[side] += m.policy["padding_ratio"] * real
            progress(f"{name} {side}: {label} {time.perf_counter() - t0:.1f} s, padding x{m.policy['padding_ratio']:.2f}")
    base = tokens / seconds["padded"] if "padded" in seconds else float("nan")
    return [[name, side, f"{computed[side] / tokens:.2f}", f"{seconds[side] / len(batches):.2f}",
             f"{tokens / seconds[side]:.0f}", f"{tokens / seconds[side] / base:.2f}x"] for side in sides]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=8, help="episodes per learner step")
    ap.add_argument("--micro-rows", type=int, default=4, help="padded side: learner.micro_batch_size")
    ap.add_argument("--budget", type=int, default=4096, help="learner.micro_batch_tokens of the other sides")
    ap.add_argument("--steps", type=int, default=1, help="timed steps per side (--rollouts: recorded steps, spread)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sides", default="padded,token,packed", help="which sides to run (a subset of the three)")
    ap.add_argument("--rollouts", default="", help="profile (a): comma-separated run folders (rollouts.jsonl)")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        rows += run_model(name, args)
    what = (f"recorded batches of {args.rollouts}" if args.rollouts else
            f"profile (b): {args.batch} episodes of 64-1280 tokens (log-normal)")
    print(table(["model", "micro-batches", "computed/real tokens", "step s", "tokens/s", "vs padded"], rows,
                title=f"learner on {what}, padded {args.micro_rows} rows / budget {args.budget} tokens"))


if __name__ == "__main__":
    print_host()
    main()
