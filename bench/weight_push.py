"""Weight push cost per transport against the learner step it follows, for the default model and SmolLM2-135M.

    python bench/weight_push.py [--models default,smollm2-135m-instruct] [--transports file,collective]
                                [--pushes 3] [--batch 16] [--seq 384] [--engine-dtype float32|bfloat16]
    python bench/weight_push.py --train-steps 6      # also: real SmolLM2 training runs, one per transport

For each model, one process runs a real vLLM engine and a real DeepSpeed Learner, as `train.py` does:
1. the learner step on a padded batch of `--batch` sequences of `--seq` tokens (1 warm-up, then timed);
2. per transport, one warm-up push, then `--pushes` weight pushes through `EngineWeightSync` while the
   engine is generating (8 streams), broken into snapshot (the learner waits: a /dev/shm file for
   `file`, packed buckets for `collective`) and the generation pause (file: pause -> RPC with the path
   -> read + reload_weights -> resume; collective: the workers receive the broadcast in the
   background over gloo, then pause -> vLLM's start/update/finish weight update from the received
   buffers -> resume);
3. this machine's memcpy bandwidth on a buffer of the same size.
Prints one table (a row per model and transport) and the ratios pause / learner step and collective /
file, measured side by side in one process. `--train-steps N` then runs `agentrl.train` on
examples/agents/smollm2_quiz.yaml for N steps per transport and prints the median push pause against
the median learner step of a real run (goal: <= 2 %).
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


async def timed_pushes(sync, engine, tok, pushes: int, label: str) -> list:
    """One warm-up push, then `pushes` timed ones, each while 8 streams generate."""
    prompt = tok.encode("<|im_start|>user\nCount to fifty.<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)
    stop = asyncio.Event()
    load = asyncio.create_task(keep_generating(engine, stop, prompt))
    await asyncio.sleep(2.0)  # let the streams reach steady decoding
    results, first = [], engine.version + 1
    for v in range(first, first + pushes + 1):
        await sync.push(v)
        (res,) = await sync.drain()
        assert res.ok, res.error
        if v == first:  # vLLM's first reload sets up its layerwise-reload state once: not counted
            print(f"  [{label}] push v{v} (warm-up): pause {res.pause_s:.3f} s", flush=True)
            continue
        results.append(res)
        print(f"  [{label}] push v{v}: snapshot {res.snapshot_s:.3f} s, pause {res.pause_s:.3f} s, "
              f"total {res.latency_s:.3f} s, {res.bytes / 1e6:.0f} MB", flush=True)
        await asyncio.sleep(1.0)
    stop.set()
    assert await load > 0
    return results


async def bench_model(name: str, args: argparse.Namespace) -> list[dict]:
    from agentrl.data.chat import load_tokenizer
    from agentrl.config import AlgoConfig, ClusterConfig, EngineConfig, LearnerConfig
    from agentrl.weights.push import LocalHub
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.weights.sync import EngineWeightSync, push_dtype
    from agentrl.rollout.fleet import EngineFleet
    from agentrl.run.startup import pick_transport

    path = resolve_model(name)
    tok = load_tokenizer(path)
    dtype = push_dtype(args.engine_dtype)
    print(f"\n== {name}: {path} (engine {args.engine_dtype})", flush=True)
    fleet = EngineFleet.local(path, EngineConfig(max_num_seqs=16, max_model_len=512, dtype=args.engine_dtype),
                              tok.eos_token_id, ClusterConfig())
    await fleet.start()
    engine = fleet.members[0].engine
    rows = []
    try:
        learner = await asyncio.to_thread(Learner, LearnerSpec(path, LearnerConfig(lr=1e-6, micro_batch_size=4),
                                                               AlgoConfig(), args.batch))
        batch = make_batch(tok, args.batch, args.seq)
        step_times = []
        for i in range(1 + args.steps):
            t0 = time.perf_counter()
            await asyncio.to_thread(learner.step, batch)
            if i:
                step_times.append(time.perf_counter() - t0)
            print(f"  learner step {i} ({'warm-up' if i == 0 else 'timed'}): {time.perf_counter() - t0:.2f} s", flush=True)
        step_s = statistics.median(step_times)
        snapshot = lambda: learner.state_dict_cpu(clone=False)  # noqa: E731
        for transport in args.transports.split(","):
            publish = None
            if transport == "collective":
                hub = LocalHub(snapshot, dtype, 300, args.bucket_mb << 20)
                publish = await pick_transport("collective", fleet, hub)
            sync = EngineWeightSync(snapshot, fleet, deadline_s=300, dtype=dtype, publish=publish)
            results = await timed_pushes(sync, engine, tok, args.pushes, transport)
            nbytes = results[0].bytes
            snap = statistics.median(r.snapshot_s for r in results)
            rows.append({"model": name, "transport": transport, "MB": nbytes / 1e6, "step_s": step_s,
                         "snapshot_s": snap, "pause_s": statistics.median(r.pause_s for r in results),
                         "total_s": statistics.median(r.latency_s for r in results),
                         "memcpy_GBps": memcpy_gbps(nbytes)})
    finally:
        await fleet.shutdown()
    return rows


def report(rows: list[dict]) -> None:
    print("\nweight push (medians; snapshot = what the learner waits for; pause = generation paused)")
    head = (f"{'model':>24} {'transport':>10} {'MB':>7} {'learner step s':>15} {'snapshot s':>11} {'pause s':>8} "
            f"{'total s':>8} {'memcpy GB/s':>12} {'pause/step':>11}")
    print(head)
    for r in rows:
        print(f"{r['model']:>24} {r['transport']:>10} {r['MB']:7.0f} {r['step_s']:15.2f} {r['snapshot_s']:11.3f} "
              f"{r['pause_s']:8.3f} {r['total_s']:8.3f} {r['memcpy_GBps']:12.2f} {r['pause_s'] / r['step_s']:10.1%}")
    for r in rows:
        print(f"ratio pause / learner step [{r['model']}, {r['transport']}]: {r['pause_s'] / r['step_s']:.4f}")
    by = {(r["model"], r["transport"]): r for r in rows}
    for model in dict.fromkeys(r["model"] for r in rows):
        if (model, "file") in by and (model, "collective") in by:
            f, c = by[model, "file"], by[model, "collective"]
            print(f"ratio collective / file [{model}]: pause {c['pause_s'] / f['pause_s']:.3f}, "
                  f"snapshot {c['snapshot_s'] / f['snapshot_s']:.3f}, total {c['total_s'] / f['total_s']:.3f}")


def real_runs(steps: int, transports: list[str]) -> None:
    """`agentrl.train` on the SmolLM2 quiz for `steps` steps per transport: median push pause against
    the median learner step, as a real run records them (metrics.jsonl)."""
    import json
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    print(f"\nreal runs: examples/agents/smollm2_quiz.yaml, {steps} steps per transport", flush=True)
    out = []
    for transport in transports:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "agentrl.train", "--config", "examples/agents/smollm2_quiz.yaml",
                            f"train.steps={steps}", f"train.out_dir={tmp}", f"weight_sync.transport={transport}",
                            "train.eval_before=false", "train.eval_after=false", "train.save_model=false",
                            "train.checkpoint_every=0"],
                           cwd=root, check=True, stdout=subprocess.DEVNULL)
            recs = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
            summary = json.loads((Path(tmp) / "summary.json").read_text())
        pauses = [r["push_pause_s"] for r in recs if r.get("push_pause_s")]
        steps_s = [r["learner_call_s"] for r in recs[1:]]  # the first step carries DeepSpeed's warm-up
        out.append((transport, summary["fleet"]["weight_transport"], statistics.median(pauses),
                    statistics.median(steps_s), time.perf_counter() - t0))
    print(f"{'transport':>10} {'used':>10} {'pause s':>8} {'learner step s':>15} {'pause/step':>11} {'wall s':>7}")
    for t, used, p, st, wall in out:
        print(f"{t:>10} {used:>10} {p:8.3f} {st:15.2f} {p / st:10.2%} {wall:7.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="default,smollm2-135m-instruct")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed learner steps (after one warm-up)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--engine-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the dtype vLLM serves (and the push sends)")
    parser.add_argument("--transports", default="file,collective")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=0, help="also real SmolLM2 runs of this many steps")
    args = parser.parse_args()
    import uvloop

    rows = [row for name in args.models.split(",") for row in uvloop.run(bench_model(name, args))]
    report(rows)
    if args.train_steps:
        real_runs(args.train_steps, args.transports.split(","))


if __name__ == "__main__":
    main()
