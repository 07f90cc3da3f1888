"""Learner throughput: `Learner.step` tokens/s vs a plain DeepSpeed forward + backward + step on the same
padded batch and model.

    python bench/learner_throughput.py [--models default,smollm2-135m-instruct] [--steps 3] [--quick]
    python bench/learner_throughput.py --device cuda --dtype bfloat16 --shape qwen-0.6b --batch 4 --seq 4096
    python bench/learner_throughput.py --shape qwen-0.6b --seq 128 --batch 1 --steps 1      # CPU smoke run

Both sides get the same model weights, the same DeepSpeed config (`agentrl.learner.models.ds_config`:
ZeRO stage, gradient clipping, bf16), torch AdamW with the same lr and weight decay, one micro-batch
holding the whole batch, and the same torch thread count. Tokens are counted the same way on both
sides: the batch's non-pad tokens (attention mask), divided by the wall time of one step.

  * agentrl bypass:    `Learner.step` with algo.mode "bypass" (vLLM's logprobs are the old policy): one
                       forward with grad, GRPO advantages, the PPO-clip loss, backward, step. The same
                       work as the plain side, so its ratio is the framework's overhead.
  * agentrl decoupled: the default mode: the learner first recomputes pi_prox with a no-grad forward
                       (decoupled PPO), about 1/3 more compute than a training step. Compared with
                       plain + the same no-grad forward, and with plain alone.
  * plain:             `deepspeed.initialize` on the HF model; forward, masked token-logprob loss
                       -sum(A * log p * mask) / sum(mask), `engine.backward`, `engine.step`.

Steps alternate between the sides (1 warm-up each, then `--steps` timed), so load from other jobs on
a shared machine lands on all of them; medians are reported. Goal: agentrl / plain >= 0.9.

`--shape qwen-0.6b` builds a randomly initialised Qwen3-0.6B-shaped model (hidden 1024, 28 layers, 16
heads of 128, 8 KV heads, MLP 3072, vocab 151,936, tied embeddings: 596M parameters) and runs the
sides one after the other (two such engines do not fit a small machine's memory together), printing
MFU = 6 * N * tokens/s / peak (N: all parameters; peak: `--peak-tflops`, 989 for an H100's dense
bf16). For reference, prime-rl publishes 11.9k tokens/s at 11.1% MFU for Qwen3-0.6B on one H100 at
16k context.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import median, print_host, progress, resolve_model, table

# Qwen3-0.6B's config.json (head_dim 128 > hidden / heads, q/k norms, tied embeddings)
QWEN_06B = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 40960, "rope_theta": 1_000_000.0}


# -- inputs ------------------------------------------------------------------------------------------------

def make_batch(vocab: int, pad_id: int, batch: int, seq: int, seed: int = 0):
    """Right-padded batch of `batch` random sequences of seq/2..seq tokens (so some rows are padded):
    a third prompt (loss mask 0), the rest generated (loss mask 1); groups of 4 with rewards 0, 1, 0, 1,
    so GRPO advantages are non-zero. A new TrainBatch each call: Learner.step fills in its advantages."""
    from agentrl.types import Episode, TrainBatch

    rng = random.Random(seed)
    episodes = []
    for i in range(batch):
        n = seq if i == 0 else rng.randint(seq // 2, seq)  # row 0 sets the padded width to `seq`
        ids = [rng.randrange(10, vocab - 1) for _ in range(n)]
        ep = Episode(task_id=f"t{i}", group_id=i // 4, reward=float(i % 2))
        ep.append(ids[: n // 3], generated=False)
        gen = n - n // 3
        ep.append(ids[n // 3:], generated=True, logprobs=[-rng.uniform(0.5, 3.0) for _ in range(gen)], versions=[0] * gen)
        episodes.append(ep)
    return TrainBatch.from_episodes(episodes, None, pad_id)


def tokens_of(batch) -> int:
    return int(batch.attention_mask.sum())


def random_model_folder(shape: dict, out: Path) -> str:
    """A randomly initialised Qwen3-shaped causal LM saved as a Hugging Face folder (what Learner loads)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**shape), dtype=torch.bfloat16)  # bf16: half the bytes to write
    model.save_pretrained(out)
    del model
    return str(out)


# -- the two sides -----------------------------------------------------------------------------------------

def learner_config(args: argparse.Namespace):
    from agentrl.config import LearnerConfig

    return LearnerConfig(micro_batch_size=args.batch, num_threads=args.threads, dtype=args.dtype)


def build_learner(path: str, mode: str, args: argparse.Namespace):
    from agentrl.config import AlgoConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    return Learner(LearnerSpec(path, learner_config(args), AlgoConfig(mode=mode), temperature=1.0, batch_size=args.batch,
                               total_steps=args.steps + 1))


def plain_engine(path: str, args: argparse.Namespace):
    """`deepspeed.initialize` on the HF model with the Learner's DeepSpeed config and optimizer."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.learner.dist import init_single_process_dist
    from agentrl.learner.models import ds_config, trainable_params

    init_single_process_dist()
    torch.set_num_threads(args.threads)
    cfg = learner_config(args)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(trainable_params(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                      config=ds_config(cfg, args.batch, 1, args.dtype == "bfloat16"))
    return engine


class PlainStep:
    """One DeepSpeed training step and nothing else. `extra_forward`: a no-grad forward first, the
    work decoupled PPO adds to recompute pi_prox."""

    def __init__(self, engine, extra_forward: bool = False) -> None:
        self.engine, self.extra_forward = engine, extra_forward

    def _token_logprobs(self, ids, attn):
        import torch

        logits = self.engine(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def __call__(self, batch) -> None:
        import torch

        dev = self.engine.device
        ids, attn = batch.input_ids.to(dev), batch.attention_mask.to(dev)
        mask = batch.loss_mask[:, 1:].to(dev)
        adv = (batch.rewards - batch.rewards.mean()).to(dev)[:, None]  # any non-zero per-row weight will do
        self.engine.train()
        if self.extra_forward:
            with torch.no_grad():
                self._token_logprobs(ids, attn)
        logp = self._token_logprobs(ids, attn)
        loss = -(adv * logp * mask).sum() / mask.sum()
        self.engine.backward(loss)
        self.engine.step()


# -- timing --------------------------------------------------------------------------------------------------

@dataclass
class Side:
    name: str
    step: Callable  # (batch) -> None
    times: list[float] = field(default_factory=list)


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_step(side: Side, batch_factory) -> float:
    batch = batch_factory()
    synchronize()
    t0 = time.perf_counter()
    side.step(batch)
    synchronize()
    return time.perf_counter() - t0


def run_interleaved(sides: list[Side], batch_factory, steps: int, label: str) -> None:
    """Warm-up, then `steps` timed rounds; the order rotates each round."""
    for i in range(steps + 1):
        order = sides[i % len(sides):] + sides[:i % len(sides)]
        for side in order:
            seconds = time_step(side, batch_factory)
            if i > 0:
                side.times.append(seconds)
            progress(f"{label}: {'warm-up' if i == 0 else f'step {i}'} {side.name}: {seconds:.2f}s")


def report_pair(sides: list[Side], column: str, label: str, ratio: str) -> None:
    """The timed steps of two sides as a table, then before / after as a ratio (`ratio` names it)."""
    rows = [[s.name, " ".join(f"{t:.2f}" for t in s.times), f"{median(s.times):.2f}"] for s in sides]
    print(table([column, "step s (timed)", "median s"], rows, label), flush=True)
    before, after = (median(s.times) for s in sides)
    print(f"{ratio} = {before / after:.2f}x ({before:.2f} s -> {after:.2f} s)", flush=True)


def run_sequential(path: str, args: argparse.Namespace, batch_factory, label: str) -> list[Side]:
    """One side at a time, freeing each before building the next (large shapes on small machines)."""
    done = []
    for name in ("agentrl bypass", "plain"):
        step = build_learner(path, "bypass", args).step if name != "plain" else PlainStep(plain_engine(path, args))
        side = Side(name, step)
        run_interleaved([side], batch_factory, args.steps, label)
        done.append(Side(name, lambda b: None, side.times))
        del side, step
        gc.collect()
    return done


# -- the logit head on its own ------------------------------------------------------------------------------

def head_breakdown(batch: int, seq: int, vocab: int, repeats: int = 3) -> list[list[str]]:
    """Seconds per micro-step of the (B, T, V) work after the model's last layer, forward + backward
    on random logits: where the learner's loss differs from the plain side's log_softmax + gather."""
    import torch

    from agentrl.algo.fused_logprobs import temperature_logprobs
    from agentrl.algo.logprobs import picked_logprobs, sampling_logits

    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq)

    def plain(logits):
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-(logp * mask[:, 1:]).sum()).backward()

    def learner(logits, entropy: bool = True):  # Learner._forward_logprobs(with_entropy=True) at top_p = 1
        lp, _ = temperature_logprobs(logits, ids, 1.0, with_entropy=entropy)
        (-(lp * mask).sum()).backward()

    def unfused(logits):  # the plain-op path the learner takes at top_p < 1, here without its vocabulary sort
        lp = picked_logprobs(sampling_logits(logits, 1.0, 1.0, scored_BT=mask), ids)
        (-(lp * mask).sum()).backward()

    variants = [("plain: log_softmax + gather", plain),
                ("agentrl: temperature_logprobs + entropy metric", learner),
                ("agentrl without the entropy metric", lambda lg: learner(lg, entropy=False)),
                ("plain-op path (top_p < 1, sort excluded)", unfused)]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(repeats):
        for name, fn in variants:
            logits = torch.randn(batch, seq, vocab, requires_grad=True)
            t0 = time.perf_counter()
            fn(logits)
            times[name].append(time.perf_counter() - t0)
    return [[name, f"{median(t):.3f}"] for name, t in times.items()]


# -- report --------------------------------------------------------------------------------------------------

def count_params(path: str) -> tuple[int, int]:
    """(all parameters, without the embedding) of the model at `path` (meta device: no weights loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.get_input_embeddings().weight.numel()


def report(label: str, sides: list[Side], tokens: int, n_params: int, peak: float | None) -> dict[str, float]:
    tps = {s.name: tokens / median(s.times) for s in sides}
    rows = []
    for s in sides:
        mfu = f"{6 * n_params * tps[s.name] / peak * 100:.2f}%" if peak else "n/a"
        rows.append([s.name, " ".join(f"{t:.2f}" for t in s.times), f"{median(s.times):.2f}", f"{tps[s.name]:.0f}", mfu])
    print(table(["side", "step s (timed)", "median s", "tokens/s", "MFU"], rows, label), flush=True)
    ratios = {}
    if "plain" in tps and "agentrl bypass" in tps:
        ratios["bypass / plain"] = tps["agentrl bypass"] / tps["plain"]
    if "agentrl decoupled" in tps:
        ratios["decoupled / plain+fwd"] = tps["agentrl decoupled"] / tps["plain + no-grad fwd"]
        ratios["decoupled / plain"] = tps["agentrl decoupled"] / tps["plain"]
    print("  " + "   ".join(f"{k} = {v:.3f}" for k, v in ratios.items()), flush=True)
    print(flush=True)
    return ratios


def bench_model(name: str, args: argparse.Namespace) -> dict[str, float]:
    from agentrl.data.chat import load_tokenizer

    path = resolve_model(name)
    tok = load_tokenizer(path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    batch_factory = lambda: make_batch(len(tok), pad, args.batch, args.seq)
    progress(f"{name}: building the learners and the plain DeepSpeed engine")
    plain = plain_engine(path, args)
    sides = [Side("agentrl bypass", build_learner(path, "bypass", args).step), Side("plain", PlainStep(plain)),
             Side("agentrl decoupled", build_learner(path, "decoupled", args).step),
             Side("plain + no-grad fwd", PlainStep(plain, extra_forward=True))]
    label = f"{name}: batch {args.batch} x {args.seq} (padded), {tokens_of(batch_factory())} tokens, {args.dtype}, " \
            f"{args.threads} threads"
    # The default model's steps take a fraction of a second: more of them for a stable median.
    run_interleaved(sides, batch_factory, args.steps if name != "default" else max(args.steps, 10), name)
    ratios = report(label, sides, tokens_of(batch_factory()), count_params(path)[0], args.peak)
    del sides, plain
    gc.collect()
    print(table(["logit head, forward + backward", "s"], head_breakdown(args.batch, args.seq, len(tok)),
                f"{name}: the (B, T, V) work after the last layer, {args.batch} x {args.seq} x {len(tok)} "
                f"random logits"), flush=True)
    print(flush=True)
    return ratios


def bench_shape(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="agentrl-qwen06b-") as tmp:
        progress("building a random Qwen3-0.6B-shaped model")
        path = random_model_folder(QWEN_06B, Path(tmp))
        total, non_embedding = count_params(path)
        batch_factory = lambda: make_batch(QWEN_06B["vocab_size"], 0, args.batch, args.seq)
        sides = run_sequential(path, args, batch_factory, "qwen-0.6b")
    label = (f"qwen-0.6b shape (random init, {total / 1e6:.0f}M parameters, {non_embedding / 1e6:.0f}M without "
             f"the embedding): batch {args.batch} x {args.seq}, {tokens_of(batch_factory())} tokens, {args.dtype}, "
             f"{args.device}")
    return report(label, sides, tokens_of(batch_factory()), total, args.peak)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from agentrl.learner.dist import usable_cores

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,smollm2-135m-instruct",
                        help="comma-separated: 'default', a prepared name, or a HF folder")
    parser.add_argument("--shape", choices=["qwen-0.6b"], default=None, help="a random model of this shape instead")
    parser.add_argument("--batch", type=int, default=None, help="sequences per batch (default: 32 for the "
                                                                "default model, 8 otherwise)")
    parser.add_argument("--seq", type=int, default=256, help="padded sequence length")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side (after 1 warm-up; at least 10 "
                                                             "for the default model, whose steps are short)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="informational: DeepSpeed picks the accelerator; cuda also sets the MFU peak")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=usable_cores(), help="torch threads (both sides)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak FLOP/s for MFU, in TFLOP/s (default: 989 with --device cuda, else no MFU)")
    parser.add_argument("--quick", action="store_true", help="a few minutes: 2 timed steps, shorter sequences")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seq = 2, 128
    peak = args.peak_tflops if args.peak_tflops is not None else (989.0 if args.device == "cuda" else None)
    args.peak = peak * 1e12 if peak else None
    return args


def main(args: argparse.Namespace) -> None:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    results = {}
    if args.shape:
        args.batch = args.batch or 1
        results[args.shape] = bench_shape(args)
    else:
        fixed_batch = args.batch
        for name in [m for m in args.models.split(",") if m]:
            args.batch = fixed_batch or (32 if name == "default" else 8)
            results[name] = bench_model(name, args)
    head = [f"{name} {r['bypass / plain']:.3f}" for name, r in results.items()]
    ok = all(r["bypass / plain"] >= 0.9 for r in results.values())
    print(f"learner throughput Learner.step (bypass) / plain DeepSpeed: {', '.join(head)} -> goal >= 0.9 "
          f"{'met' if ok else 'NOT met'}", flush=True)
    extra = [f"{name} {r['decoupled / plain+fwd']:.3f} (vs plain alone {r['decoupled / plain']:.3f})"
             for name, r in results.items() if "decoupled / plain+fwd" in r]
    if extra:
        print(f"decoupled Learner.step / plain with the same extra no-grad forward: {', '.join(extra)}", flush=True)


if __name__ == "__main__":
    print_host()
    main(parse_args())
