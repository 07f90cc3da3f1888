"""pi_prox from the training pass with a reference model: `Learner.step` under `algo.kl: {type: loss}`
(the SmolLM2 examples' algorithm) or `{type: reward}` (the pipeline's PPO: the penalty reads the
behaviour logprobs), taking pi_prox from its training pass against a no-grad forward pass of its own
(what it did before).

    python bench/prox_reuse.py [--model smollm2-135m-instruct] [--batch 16] [--seq 384] [--steps 3] [--kl loss]
    python bench/prox_reuse.py --model default --batch 64 --seq 96 --steps 5 --kl reward   # the pipeline's shape

Both sides: the same model, reference, batch shape (the reasoning_gym example's when this was measured: 16
episodes of up to about 380 tokens), lr, thread count; steps alternate between them (1 warm-up each, then `--steps` timed),
so load from other jobs lands on both; medians are reported. The sides train the same steps (their
loss and KL metric agree to 1e-5: tests/test_learner_ppo.py), so the ratio is the forward pass saved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import progress, resolve_model
from bench.learner_throughput import Side, make_batch, report_pair, run_interleaved, tokens_of


def build(path: str, args: argparse.Namespace, reuse: bool):
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    class OwnPass(Learner):  # pi_prox from a no-grad forward pass before training
        reuses_prox = False

    cls = Learner if reuse else OwnPass
    learner = cls(LearnerSpec(path, LearnerConfig(lr=3e-5, micro_batch_size=args.batch, num_threads=args.threads),
                              AlgoConfig(kl={"type": args.kl, "coef": 0.01}), temperature=1.0, batch_size=args.batch,
                              total_steps=args.steps + 1))
    assert learner.reuses_prox == reuse
    return learner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable cores)")
    ap.add_argument("--kl", choices=("loss", "reward"), default="loss", help="the KL term's type")
    args = ap.parse_args()

    from agentrl.data.chat import load_tokenizer
    from agentrl.learner.dist import usable_cores

    args.threads = args.threads or usable_cores()

    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    batch_factory = lambda: make_batch(len(tok), pad, args.batch, args.seq)
    progress(f"{args.model}: building both learners (actor + reference each)")
    sides = [Side("own no-grad pass (before)", build(path, args, reuse=False).step),
             Side("from the training pass", build(path, args, reuse=True).step)]
    run_interleaved(sides, batch_factory, args.steps, args.model)
    label = (f"{args.model}: Learner.step with a reference and a KL {args.kl} term, batch {args.batch} x {args.seq} "
             f"(padded), {tokens_of(batch_factory())} tokens, {args.threads} threads")
    report_pair(sides, "pi_prox", label, "step time own pass / reused")


if __name__ == "__main__":
    main()
