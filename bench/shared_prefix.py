"""A group's common prompt through the learner once (agentrl/learner/shared_prefix.py) against every
row running it, side by side: `Learner.step` with a reference and a KL loss term (the SmolLM2
examples' algorithm) on a batch shaped like reasoning_gym.yaml's when this was measured (2 groups of 8, two attempts;
the yaml now trains 4 groups of 8 on one attempt: `--groups 4`).

    python bench/shared_prefix.py [--model smollm2-135m-instruct] [--groups 2] [--n 8] [--prompt 127] [--steps 3]

The batch: `--groups` tasks of `--n` episodes, each task's prompt `--prompt` random tokens shared by its
episodes, then a reply of 4-16 tokens, an env turn of 20 and a second reply of 0-16 (reasoning_gym's
two attempts; about 180 tokens a row at the defaults). One learner, the same batch each step; steps
alternate between the sides (1 warm-up each, then `--steps` timed), so load from other jobs lands on
both; medians are reported. The sides compute the same step (tests/test_shared_prefix.py: metrics to
1e-5, weights to 1e-6), so the ratio is the prompt work saved. A model too small for sharing to pay
(`MIN_SAVED`: the embedded default) runs the ordinary pass on both sides.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import progress, resolve_model
from bench.learner_throughput import Side, report_pair, run_interleaved, tokens_of


def make_batch(vocab: int, pad_id: int, args: argparse.Namespace):
    from agentrl.types import Episode, TrainBatch

    rng = random.Random(0)
    episodes = []
    for g in range(args.groups):
        prompt = [rng.randrange(10, vocab - 1) for _ in range(args.prompt)]
        for k in range(args.n):
            ep = Episode(task_id=f"t{g}", group_id=g, reward=float(k % 2))
            ep.append(prompt, generated=False)
            for generated, n in ((True, rng.randint(4, 16)), (False, 20), (True, rng.randint(0, 16))):
                ids = [rng.randrange(10, vocab - 1) for _ in range(n)]
                ep.append(ids, generated=generated, **({"logprobs": [-1.0] * n, "versions": [0] * n} if generated else {}))
            episodes.append(ep)
    return TrainBatch.from_episodes(episodes, None, pad_id)


def side(learner, share: bool):
    default = learner.share_min_saved

    def step(batch):
        learner.share_min_saved = default if share else float("inf")  # inf: no group saves enough to share
        learner.step(batch)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--n", type=int, default=8, help="episodes per task")
    ap.add_argument("--prompt", type=int, default=127, help="prompt tokens (reasoning_gym.yaml's 3-shot prompt: 127)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable cores)")
    args = ap.parse_args()

    from agentrl.data.chat import load_tokenizer
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.dist import usable_cores
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    args.threads = args.threads or usable_cores()
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = args.groups * args.n
    progress(f"{args.model}: building the learner (actor + reference)")
    learner = Learner(LearnerSpec(path, LearnerConfig(lr=3e-5, micro_batch_size=rows, num_threads=args.threads),
                                  AlgoConfig(kl={"type": "loss", "coef": 0.01}), temperature=1.0, batch_size=rows,
                                  total_steps=2 * (args.steps + 1)))
    batch_factory = lambda: make_batch(len(tok), pad, args)
    sides = [Side("every row runs its prompt", side(learner, False)),
             Side("the group's prompt once", side(learner, True))]
    run_interleaved(sides, batch_factory, args.steps, args.model)
    batch = batch_factory()
    width = batch.input_ids.shape[1]
    shared_tokens = args.groups * (args.prompt - 1) + rows * (width - args.prompt + 1)
    label = (f"{args.model}: Learner.step with a reference and a KL loss term, {args.groups} groups x {args.n}, "
             f"prompt {args.prompt}, rows padded to {width} ({tokens_of(batch)} tokens; positions run per pass: "
             f"{rows * width} -> {shared_tokens}), {args.threads} threads")
    report_pair(sides, "prompt", label, "step time every row / shared")


if __name__ == "__main__":
    main()
