"""Rollout throughput: agentrl's RolloutPool vs the same token requests sent straight to vLLM's AsyncLLM,
and the event-loop cost per env step with 1,000 concurrent episodes.

    python bench/rollout_throughput.py [--models default,smollm2-135m-instruct] [--rounds 3] [--quick] [--unseeded]

Part 1, per model (one engine start; both sides share it):
  * agentrl: multi-turn episodes of `StoryEnv` (3 turns, the env replying between turns) run by
    `RolloutPool.episode` -> `run_episode` -> `Engine.generate` with per-episode seeds (as
    `pool.evaluate` runs them), on uvloop as in train.py; `--unseeded` runs them through `pool.group`
    without seeds, as the training Producer does. Every turn generates exactly `--tokens` tokens (64):
    agentrl's Engine has no `min_tokens` and the tiny default model ends a turn after a few tokens, so
    `vllm.SamplingParams` is wrapped to set `min_tokens = max_tokens` (a constructor argument per
    turn, no per-token work).
  * raw: the framework round's requests replayed on `AsyncLLM.generate`: each episode's turns in
    order, the same sampling parameters and seeds (turn k of an episode with seed s: s * 1000 + k, as
    run_episode), `min_tokens = max_tokens =` the turn's length, logprobs on, DELTA outputs, the same
    concurrency. Turn k's prompt is the first prompt, then each earlier turn's sampled tokens followed by
    the env tokens agentrl appended after it, so when the seeds reproduce agentrl's samples (the
    "equal samples" share in the title, 100% when seeded) these are agentrl's exact requests; unseeded,
    they extend what the raw stream itself sampled, so prefix caching saves both sides the same
    prefill. No env, ledger, chat template or per-token Python beyond collecting the ids.
  Rounds alternate the order (A R, R A, ...); the prefix cache is reset before every side. Prints
  generated tokens/s per round, the agentrl/raw ratio per round and its median (goal >= 0.95), and
  this process's CPU seconds per round (the frontend: AsyncLLM's output handling plus, for agentrl,
  the rollout code; vLLM's engine core runs in its own process, pinned to one core).

Part 2: 1,000 concurrent 3-turn episodes through RolloutPool / run_episode against an in-memory engine
  that returns 64 real tokens after one event-loop pass, vs a bare asyncio loop doing the same awaits
  (the semaphore, one loop pass per turn, the env's awaits): ms per env step (goal < 1 ms) and a
  breakdown of the per-step Python work (decode, tool parser, chat-template suffix, ledger, wait_for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import median, print_host, progress, resolve_model, run_uvloop, table
from bench._event_loop import event_loop_cost, print_breakdown
from bench._story import StoryEnv, story_tasks


@contextlib.contextmanager
def forced_turn_length():
    """Every SamplingParams built through `vllm.SamplingParams` (Engine.generate's import) gets
    min_tokens = max_tokens, so each turn generates exactly its budget whatever the model prefers."""
    import vllm

    original = vllm.SamplingParams

    def params(*args, **kwargs):
        kwargs.setdefault("min_tokens", kwargs.get("max_tokens") or 0)
        return original(*args, **kwargs)

    vllm.SamplingParams = params
    try:
        yield
    finally:
        vllm.SamplingParams = original


# -- part 1: framework vs raw on one real engine -----------------------------------------------------

@dataclass
class Round:
    side: str  # "agentrl" or "raw"
    tokens: int
    seconds: float
    cpu_s: float  # CPU time of this (frontend) process during the round

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


MAX_LEN = 512  # the default model's context; 3 turns of 64 tokens and their prompts fit in ~300


@dataclass
class EpisodeRecord:
    """What one framework episode sent, so the raw side can send the same requests."""

    prompt: list[int]  # the first prompt's tokens
    turns: list[tuple[int, list[int]]]  # per turn: (tokens generated, env tokens appended after it)
    generated: list[list[int]]  # the framework's sampled tokens per turn (compared with the replay's)
    seed: int | None  # run_episode's per-episode seed; turn k used seed * 1000 + k


def record_of(e, seed: int | None) -> EpisodeRecord:
    turns, generated = [], []
    for t in e.turns:
        end = t.start + t.n_generated
        turns.append((t.n_generated, e.tokens[end:end + t.env_tokens]))
        generated.append(e.tokens[t.start:end])
    return EpisodeRecord(e.tokens[:e.prompt_len], turns, generated, seed)


async def framework_round(pool, tasks: list[dict], group_size: int, seed0: int | None) -> tuple[Round, list]:
    """`group_size` episodes per task, all at once: pool.group as the Producer runs them, or with
    per-episode seeds (pool.episode, as pool.evaluate runs them) when `seed0` is set."""
    t0, c0 = time.perf_counter(), time.process_time()
    if seed0 is None:
        groups = await asyncio.gather(*(pool.group(t, i, group_size) for i, t in enumerate(tasks)))
        episodes, seeds = [e for g in groups for e in g.episodes], [None] * len(tasks) * group_size
    else:
        seeds = [seed0 + k for k in range(len(tasks) * group_size)]
        episodes = await asyncio.gather(*(pool.episode(tasks[k // group_size], k // group_size, seed=s)
                                          for k, s in enumerate(seeds)))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    bad = [e for e in episodes if e.status not in ("ok", "truncated")]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed, e.g. {bad[0].status}: {bad[0].error}")
    records = [record_of(e, s) for e, s in zip(episodes, seeds)]
    return Round("agentrl", sum(e.n_generated for e in episodes), seconds, cpu), records


async def raw_round(llm, records: list[EpisodeRecord], eos_id: int, temperature: float, top_p: float,
                    concurrency: int, tag: str) -> tuple[Round, float]:
    """Replay `records` on AsyncLLM, `concurrency` episodes at a time. Each episode's turns go in order,
    and turn k's prompt is the first prompt, then each earlier turn's own sampled tokens followed by
    the env tokens the framework appended after it: the framework's prompts exactly when the seeds
    reproduce its samples, and otherwise prompts that extend what this stream generated, so prefix
    caching saves both sides the same prefill. Returns the round and the share of sampled tokens
    equal to the framework's."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    sem = asyncio.Semaphore(concurrency)
    same = [0]

    async def episode(i: int, rec: EpisodeRecord) -> int:
        n, ledger = 0, list(rec.prompt)
        async with sem:
            for k, (length, env_ids) in enumerate(rec.turns):
                params = SamplingParams(max_tokens=length, min_tokens=length, temperature=temperature, top_p=top_p,
                                        seed=None if rec.seed is None else rec.seed * 1000 + k, logprobs=0,
                                        stop_token_ids=[eos_id], output_kind=RequestOutputKind.DELTA,
                                        detokenize=False)
                ids: list[int] = []
                async for out in llm.generate({"prompt_token_ids": ledger}, params, request_id=f"raw-{tag}-{i}-{k}"):
                    ids += out.outputs[0].token_ids
                same[0] += sum(a == b for a, b in zip(ids, rec.generated[k]))
                n += len(ids)
                ledger = ledger + ids + env_ids
        return n

    t0, c0 = time.perf_counter(), time.process_time()
    counts = await asyncio.gather(*(episode(i, rec) for i, rec in enumerate(records)))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Round("raw", sum(counts), seconds, cpu), same[0] / max(sum(counts), 1)


def engine_config(args: argparse.Namespace, episodes: int):
    from agentrl.config import EngineConfig

    # Room for every episode's whole ledger in the KV cache, so neither side is preempted.
    return EngineConfig(max_num_seqs=max(episodes, 8), max_model_len=MAX_LEN, kv_cache_memory_bytes=args.kv_bytes,
                        max_num_batched_tokens=8192)


async def alternate_rounds(engine, pool, fmt, episodes: int, group: int, args: argparse.Namespace, name: str):
    """Warm-up, then `args.rounds` rounds of both sides, the order alternating; the prefix cache is
    emptied before every side. Returns [(framework, raw)], the share of equal samples per round and
    the latest records."""
    n_tasks = episodes // group
    seeded = not args.unseeded
    # Warm-up: the engine's first batches are slow (kernel set-up), whichever side sends them.
    await framework_round(pool, story_tasks(1), min(group, 2), 0 if seeded else None)
    rounds, same_share, records = [], [], []
    for r in range(args.rounds):
        fw = raw = None
        for side in (("agentrl", "raw") if r % 2 == 0 else ("raw", "agentrl")):
            await engine.llm.reset_prefix_cache()
            if side == "agentrl":
                seed0 = (r + 1) * 100_000 if seeded else None
                fw, records = await framework_round(pool, story_tasks(n_tasks, r * n_tasks), group, seed0)
            else:  # replays the latest framework round (the previous one when raw goes first)
                raw, same = await raw_round(engine.llm, records, fmt.eos_id, 1.0, 1.0, episodes, str(r))
        rounds.append((fw, raw))
        same_share.append(same)
        progress(f"{name}: round {r}: agentrl {fw.tps:.0f} tok/s, raw {raw.tps:.0f} tok/s, ratio {fw.tps / raw.tps:.3f}")
    return rounds, same_share, records


async def compare_model(name: str, episodes: int, args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.config import RolloutConfig
    from agentrl.rollout.engine import Engine
    from agentrl.rollout.episode import EpisodeSpec
    from agentrl.rollout.pool import RolloutPool

    path = resolve_model(name)
    fmt = ChatFormat(load_tokenizer(path))
    group = min(args.group, episodes)
    progress(f"{name}: starting the vLLM engine")
    engine = Engine.start(path, engine_config(args, episodes), fmt.eos_id)
    rollout = RolloutConfig(max_tokens_per_turn=args.tokens, max_turns=StoryEnv.turns, max_concurrency=episodes,
                            n_samples=group, turn_timeout_s=600, episode_timeout_s=3600)
    pool = RolloutPool(engine, EpisodeSpec(StoryEnv, {}, fmt, rollout, MAX_LEN))
    try:
        with forced_turn_length():
            rounds, same_share, records = await alternate_rounds(engine, pool, fmt, episodes, group, args, name)
    finally:
        engine.shutdown()
    turn_lengths = [n for rec in records for n, _ in rec.turns]
    return {"name": name, "episodes": episodes, "rounds": rounds, "turn_min": min(turn_lengths),
            "turn_mean": sum(turn_lengths) / len(turn_lengths), "same": median(same_share),
            "prompt_max": max(len(rec.prompt) + sum(n + len(env) for n, env in rec.turns[:-1]) for rec in records)}


def report_model(res: dict[str, Any]) -> float:
    rows = []
    for r, (fw, raw) in enumerate(res["rounds"]):
        rows.append([f"round {r}", f"{fw.tokens}", f"{fw.seconds:.2f}", f"{fw.tps:.0f}", f"{fw.cpu_s:.2f}",
                     f"{raw.tokens}", f"{raw.seconds:.2f}", f"{raw.tps:.0f}", f"{raw.cpu_s:.2f}",
                     f"{fw.tps / raw.tps:.3f}"])
    ratio = median([fw.tps / raw.tps for fw, raw in res["rounds"]])
    rows.append(["median", "", "", f"{median([f.tps for f, _ in res['rounds']]):.0f}", "", "", "",
                 f"{median([r.tps for _, r in res['rounds']]):.0f}", "", f"{ratio:.3f}"])
    title = (f"{res['name']}: {res['episodes']} episodes x {StoryEnv.turns} turns, generated tokens per turn "
             f"min {res['turn_min']} mean {res['turn_mean']:.1f}, longest prompt {res['prompt_max']} tokens, "
             f"raw samples equal to agentrl's {100 * res['same']:.0f}%")
    print(table(["", "agentrl tok", "s", "tok/s", "cpu s", "raw tok", "s", "tok/s", "cpu s", "agentrl/raw"],
                rows, title), flush=True)
    print(flush=True)
    return ratio


# -- main ----------------------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> None:
    models = [m for m in args.models.split(",") if m]
    ratios = {}
    for name in models:
        episodes = args.episodes_default if name == "default" else args.episodes
        ratios[name] = report_model(await compare_model(name, episodes, args))

    progress("event-loop cost: 1,000 concurrent episodes against an in-memory engine")
    rows = [await event_loop_cost(name, args.loop_episodes, args.tokens, args.loop_repeats) for name in models]
    print(table(["tokenizer", "episodes", "env steps", "wall s", "ms/step", "bare ms/step", "overhead ms/step",
                 "< 1 ms"], rows, f"Event-loop cost per env step ({args.loop_episodes} concurrent episodes x "
                                  f"{StoryEnv.turns} turns x {args.tokens} tokens, uvloop, median of "
                                  f"{args.loop_repeats})"), flush=True)
    print(flush=True)
    await print_breakdown(models[-1], args.tokens)
    summary = ", ".join(f"{n} {r:.3f}" for n, r in ratios.items())
    ok = all(r >= 0.95 for r in ratios.values())
    print(f"rollout throughput agentrl/raw (median of {args.rounds} rounds): {summary} -> goal >= 0.95 "
          f"{'met' if ok else 'NOT met'}", flush=True)
    worst = max(float(r[4]) for r in rows)
    print(f"event-loop cost per env step, {args.loop_episodes} concurrent episodes: {worst:.3f} ms -> goal < 1 ms "
          f"{'met' if worst < 1.0 else 'NOT met'}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,smollm2-135m-instruct",
                        help="comma-separated: 'default', a prepared name, or a HF folder")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per round (real models)")
    parser.add_argument("--episodes-default", type=int, default=128, help="episodes per round (default model)")
    parser.add_argument("--group", type=int, default=8, help="episodes per task (pool.group)")
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per turn")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side, alternating order")
    parser.add_argument("--kv-bytes", type=int, default=1 << 30, help="vLLM KV cache bytes")
    parser.add_argument("--loop-episodes", type=int, default=1000)
    parser.add_argument("--loop-repeats", type=int, default=3)
    parser.add_argument("--unseeded", action="store_true",
                        help="unseeded episodes through pool.group (the training path); the raw replay then samples "
                             "its own tokens and extends its own prompts. Default: per-episode seeds (pool.episode, "
                             "as evaluation runs them) and a seeded replay that sends the framework's exact requests")
    parser.add_argument("--quick", action="store_true", help="~2 minutes: fewer episodes and 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.episodes_default, args.rounds, args.loop_repeats = 8, 64, 2, 2
    return args


if __name__ == "__main__":
    print_host()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    run_uvloop(main(parse_args()))
