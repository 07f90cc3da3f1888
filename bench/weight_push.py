"""Weight push cost against the learner step it follows, for the default model and SmolLM2-135M.

    python bench/weight_push.py [--models default,smollm2-135m-instruct] [--pushes 3] [--batch 16] [--seq 384]
                                [--engine-dtype float32|bfloat16]

For each model, one process runs a real vLLM engine and a real DeepSpeed Learner, as `train.py` does:
1. the learner step on a padded batch of `--batch` sequences of `--seq` tokens (1 warm-up, then timed);
2. one warm-up push, then `--pushes` weight pushes through `EngineWeightSync` while the engine is generating, broken into
   snapshot (learner weights -> safetensors file in /dev/shm; the learner waits for this),
   hand-over read (the file read back, timed here in this process as the worker does it),
   and the generation pause (pause -> RPC with the path -> reload_weights -> resume);
3. this machine's memcpy bandwidth on a buffer of the same size, next to the hand-over's bytes/s.
Prints a table per model and the ratio pause / learner step (goal: <= 2 % on SmolLM2). With `--engine-dtype
bfloat16` the engine serves bfloat16 and the learner (float32) sends its weights cast to bfloat16: half the bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import resolve_model


def memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def read_file_s(path: Path) -> float:
    """What the worker does with the hand-over file before reload_weights: read every tensor."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            f.get_tensor(name)
    return time.perf_counter() - t0


def make_batch(tokenizer, batch: int, seq: int, seed: int = 0):
    """Padded batch of `batch` sequences of `seq` random tokens, the last half generated (trained)."""
    import torch

    from agentrl.types import Episode, TrainBatch

    rng = random.Random(seed)
    episodes = []
    for i in range(batch):
        ids = [rng.randrange(100, tokenizer.vocab_size - 1) for _ in range(seq)]
        ep = Episode(task_id=f"t{i}", group_id=i // 2, reward=float(i % 2))
        ep.append(ids[: seq // 2], generated=False)
        ep.append(ids[seq // 2:], generated=True, logprobs=[-1.0] * (seq - seq // 2), versions=[0] * (seq - seq // 2))
        episodes.append(ep)
    adv = torch.tensor([1.0 if i % 2 else -1.0 for i in range(batch)])
    return TrainBatch.from_episodes(episodes, adv, tokenizer.pad_token_id)


async def keep_generating(engine, stop: asyncio.Event, prompt: list[int]) -> int:
    """Background load: 8 streams of generation, so each push pauses real in-flight requests."""
    async def stream(i: int) -> int:
        n = 0
        while not stop.is_set():
            gen = await engine.generate(prompt, max_tokens=32, seed=i * 1000 + n)
            n += len(gen.token_ids)
        return n

    return sum(await asyncio.gather(*(stream(i) for i in range(8))))


async def bench_model(name: str, args: argparse.Namespace) -> dict:
    from agentrl.chat import load_tokenizer
    from agentrl.config import AlgoConfig, EngineConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.weight_sync import EngineWeightSync, handover_dir, push_dtype
    from agentrl.rollout.engine import Engine

    path = resolve_model(name)
    tok = load_tokenizer(path)
    print(f"\n== {name}: {path} (engine {args.engine_dtype})", flush=True)
    engine = Engine.start(path, EngineConfig(max_num_seqs=16, max_model_len=512, dtype=args.engine_dtype), tok.eos_token_id)
    try:
        learner = await asyncio.to_thread(Learner, path, LearnerConfig(lr=1e-6, micro_batch_size=4), AlgoConfig(),
                                          1.0, args.batch)
        batch = make_batch(tok, args.batch, args.seq)
        step_times = []
        for i in range(1 + args.steps):
            t0 = time.perf_counter()
            await asyncio.to_thread(learner.step, batch)
            if i:
                step_times.append(time.perf_counter() - t0)
            print(f"  learner step {i} ({'warm-up' if i == 0 else 'timed'}): {time.perf_counter() - t0:.2f} s", flush=True)
        step_s = statistics.median(step_times)

        sync = EngineWeightSync(lambda: learner.state_dict_cpu(clone=False), engine, deadline_s=300,
                                dtype=push_dtype(args.engine_dtype))
        prompt = tok.encode("<|im_start|>user\nCount to fifty.<|im_end|>\n<|im_start|>assistant\n",
                            add_special_tokens=False)
        stop = asyncio.Event()
        load = asyncio.create_task(keep_generating(engine, stop, prompt))
        await asyncio.sleep(2.0)  # let the streams reach steady decoding
        results, reads = [], []
        for v in range(1, args.pushes + 2):
            await sync.push(v)
            (res,) = await sync.drain()
            assert res.ok, res.error
            if v == 1:  # vLLM's first reload sets up its layerwise-reload state once: not counted
                print(f"  push v1 (warm-up): pause {res.pause_s:.3f} s", flush=True)
                continue
            results.append(res)
            # The push removed its file; write one the same way to time the worker's read of it.
            state = learner.state_dict_cpu(clone=False)
            probe = handover_dir(None, res.bytes) / "agentrl-bench-read.safetensors"
            from agentrl.learner.weight_sync import write_snapshot

            write_snapshot(state, probe, push_dtype(args.engine_dtype))
            reads.append(read_file_s(probe))
            probe.unlink()
            print(f"  push v{v}: snapshot {res.snapshot_s:.3f} s, pause {res.pause_s:.3f} s, "
                  f"total {res.latency_s:.3f} s, {res.bytes / 1e6:.0f} MB", flush=True)
            await asyncio.sleep(1.0)
        stop.set()
        generated = await load
        assert engine.version == args.pushes + 1 and generated > 0
    finally:
        engine.shutdown()
    nbytes = results[0].bytes
    snap = statistics.median(r.snapshot_s for r in results)
    pause = statistics.median(r.pause_s for r in results)
    read = statistics.median(reads)
    return {"model": name, "MB": nbytes / 1e6, "step_s": step_s, "snapshot_s": snap, "read_s": read,
            "pause_s": pause, "reload_s": pause - read, "total_s": statistics.median(r.latency_s for r in results),
            "write_GBps": nbytes / snap / 1e9, "read_GBps": nbytes / read / 1e9, "memcpy_GBps": memcpy_gbps(nbytes)}


def report(rows: list[dict]) -> None:
    print("\nweight push (medians; snapshot = learner weights -> /dev/shm file, learner waits; "
          "pause = generation paused: RPC(path) -> worker read -> reload_weights -> resume)")
    head = (f"{'model':>24} {'MB':>7} {'learner step s':>15} {'snapshot s':>11} {'pause s':>8} "
            f"{'~read s':>8} {'~reload s':>10} {'write GB/s':>11} {'read GB/s':>10} {'memcpy GB/s':>12} "
            f"{'pause/step':>11}")
    print(head)
    for r in rows:
        print(f"{r['model']:>24} {r['MB']:7.0f} {r['step_s']:15.2f} {r['snapshot_s']:11.3f} {r['pause_s']:8.3f} "
              f"{r['read_s']:8.3f} {r['reload_s']:10.3f} {r['write_GBps']:11.2f} {r['read_GBps']:10.2f} "
              f"{r['memcpy_GBps']:12.2f} {r['pause_s'] / r['step_s']:10.1%}")
    for r in rows:
        print(f"ratio pause / learner step [{r['model']}]: {r['pause_s'] / r['step_s']:.4f}  "
              f"(snapshot / learner step: {r['snapshot_s'] / r['step_s']:.4f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="default,smollm2-135m-instruct")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed learner steps (after one warm-up)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--engine-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the dtype vLLM serves (and the push sends)")
    args = parser.parse_args()
    import uvloop

    rows = [uvloop.run(bench_model(name, args)) for name in args.models.split(",")]
    report(rows)


if __name__ == "__main__":
    main()
