"""Rollout throughput: agentrl's RolloutPool vs raw vLLM AsyncLLM on the same prompts, same engine.

    python bench/rollout_throughput.py [--episodes 512] [--rounds 3] [--max-tokens 16]

Single-turn episodes (envs.arithmetic) so both sides do exactly one generate per prompt; the raw
side sends the identical prompt token ids with the same sampling parameters straight to
`AsyncLLM.generate` with the same concurrency. Rounds alternate raw / framework; medians reported.
Prints generated tokens/s for each and the ratio framework/raw (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def raw_round(engine, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[int, float]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    sem = asyncio.Semaphore(concurrency)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, logprobs=0, detokenize=False,
                            stop_token_ids=[engine.eos_id], output_kind=RequestOutputKind.DELTA)

    async def one(i: int, ids: list[int]) -> int:
        n = 0
        async with sem:
            async for out in engine.llm.generate({"prompt_token_ids": ids}, params, request_id=f"raw-{i}-{time.time()}"):
                n += len(out.outputs[0].token_ids)
        return n

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return sum(counts), time.perf_counter() - t0


async def framework_round(pool, tasks: list[dict]) -> tuple[int, float]:
    t0 = time.perf_counter()
    episodes = await asyncio.gather(*(pool.episode(t, i) for i, t in enumerate(tasks)))
    return sum(e.n_generated for e in episodes), time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    from agentrl.chat import ChatFormat, load_tokenizer
    from agentrl.config import DefaultModelConfig, EngineConfig, RolloutConfig
    from agentrl.default_model import ensure_default_model
    from agentrl.rollout.engine import Engine
    from agentrl.rollout.episode import EpisodeSpec
    from agentrl.rollout.pool import RolloutPool
    from envs.arithmetic import ArithmeticEnv

    model = args.model or str(ensure_default_model(DefaultModelConfig()))
    tok = load_tokenizer(model)
    fmt = ChatFormat(tok)
    tasks = ArithmeticEnv.make_tasks(args.episodes, 0, "bench")
    prompts = [fmt.initial([{"role": "user", "content": f"What is {t['a']} {t['op']} {t['b']}?"}]) for t in tasks]
    engine = Engine.start(model, EngineConfig(max_num_seqs=args.concurrency), fmt.eos_id)
    rollout = RolloutConfig(max_tokens_per_turn=args.max_tokens, max_turns=1, max_concurrency=args.concurrency)
    pool = RolloutPool(engine, EpisodeSpec(ArithmeticEnv, {}, fmt, rollout, 512))
    try:
        await raw_round(engine, prompts[:64], args.max_tokens, args.concurrency)  # warm-up
        raw, fw = [], []
        for r in range(args.rounds):
            n_raw, t_raw = await raw_round(engine, prompts, args.max_tokens, args.concurrency)
            n_fw, t_fw = await framework_round(pool, tasks)
            raw.append(n_raw / t_raw)
            fw.append(n_fw / t_fw)
            print(f"round {r}: raw {n_raw} tok in {t_raw:.2f}s = {raw[-1]:.0f} tok/s | "
                  f"agentrl {n_fw} tok in {t_fw:.2f}s = {fw[-1]:.0f} tok/s | ratio {fw[-1] / raw[-1]:.3f}")
        print(f"median generated tokens/s: raw vLLM {statistics.median(raw):.0f}, agentrl RolloutPool "
              f"{statistics.median(fw):.0f}; framework/raw = {statistics.median(fw) / statistics.median(raw):.3f} "
              f"({args.episodes} episodes, concurrency {args.concurrency}, {os.cpu_count()} cpus)")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: the embedded default model)")
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=64)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    asyncio.run(main(parser.parse_args()))
