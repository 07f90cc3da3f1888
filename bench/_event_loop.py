"""Part 2 of bench/rollout_throughput.py: the event-loop cost per env step with many concurrent episodes
against an in-memory engine, and where one env step's Python time goes."""

from __future__ import annotations

import asyncio
import time

from bench._common import median, progress, resolve_model, table
from bench._story import StoryEnv, story_tasks


class InstantEngine:
    """In-memory GenerateFn: every turn is the same real tokens, returned after one event-loop pass
    (a real engine wakes each request once per engine step)."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids

    async def generate(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, seed=None):
        from agentrl.rollout.engine import Generation

        await asyncio.sleep(0)
        n = min(max_tokens, len(self.token_ids))
        return Generation(self.token_ids[:n], [-1.0] * n, [0] * n, "length")


async def _noop() -> None:
    return None


async def bare_loop(episodes: int, turns: int) -> float:
    """The awaits an episode makes with none of the work: the pool's semaphore, reset, and per turn one
    loop pass (the engine) and one env step."""
    sem = asyncio.Semaphore(episodes)

    async def episode() -> None:
        async with sem:
            await _noop()
            for _ in range(turns):
                await asyncio.sleep(0)
                await _noop()

    t0 = time.perf_counter()
    await asyncio.gather(*(episode() for _ in range(episodes)))
    return time.perf_counter() - t0


async def framework_loop(fmt, reply_ids: list[int], episodes: int, tokens: int) -> tuple[float, int]:
    from agentrl.config import RolloutConfig
    from agentrl.rollout.episode import EpisodeSpec
    from agentrl.rollout.pool import RolloutPool

    rollout = RolloutConfig(max_tokens_per_turn=tokens, max_turns=StoryEnv.turns, max_concurrency=episodes, n_samples=8)
    pool = RolloutPool(InstantEngine(reply_ids), EpisodeSpec(StoryEnv, {}, fmt, rollout, 4096))
    t0 = time.perf_counter()
    groups = await asyncio.gather(*(pool.group(t, i, 8) for i, t in enumerate(story_tasks(episodes // 8))))
    seconds = time.perf_counter() - t0
    return seconds, sum(len(e.turns) for g in groups for e in g.episodes)


def per_call_us(fn, repeats: int = 300) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e6


async def per_await_us(make, repeats: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        await make()
    return (time.perf_counter() - t0) / repeats * 1e6


async def step_breakdown(fmt, reply_ids: list[int]) -> list[list[str]]:
    """The Python work run_episode does per env step, each piece timed on its own (µs per call)."""
    from agentrl.rollout.tools import get_tool_parser
    from agentrl.types import Episode

    text = fmt.tokenizer.decode(reply_ids)
    parser = get_tool_parser("hermes")
    reply = [{"role": "user", "content": "Go on. What happens next to a talking cat?"}]
    n = len(reply_ids)

    def ledger() -> None:
        ep = Episode("t", 0)
        ep.append(reply_ids, generated=True, logprobs=[-1.0] * n, versions=[0] * n)
        ep.append([1] * 20, generated=False)

    async def wait_for_pair() -> None:  # run_episode wraps generate and env.step in asyncio.wait_for
        await asyncio.wait_for(_noop(), 30)
        await asyncio.wait_for(_noop(), 30)

    async def bare_pair() -> None:
        await _noop()
        await _noop()

    rows = [
        ("tokenizer.decode(turn)", per_call_us(lambda: fmt.tokenizer.decode(reply_ids))),
        ("tool parser (hermes)", per_call_us(lambda: parser(text))),
        ("ChatFormat.continuation(reply)", per_call_us(lambda: fmt.continuation(reply))),
        ("Episode.append(turn + suffix)", per_call_us(ledger)),
        ("2 x asyncio.wait_for", await per_await_us(wait_for_pair)),
        ("   the same 2 awaits bare", await per_await_us(bare_pair)),
    ]
    return [[name, f"{us:.1f}"] for name, us in rows]


async def event_loop_cost(name: str, episodes: int, tokens: int, repeats: int) -> list[str]:
    from agentrl.data.chat import ChatFormat, load_tokenizer

    fmt = ChatFormat(load_tokenizer(resolve_model(name)))
    sentence = " The lighthouse keeper climbed the stairs again, counting each step as the storm grew louder."
    reply_ids = fmt.encode(sentence * (tokens // 16 + 2))[:tokens]
    fw, bare, steps = [], [], 0
    for _ in range(repeats):  # alternate, so load from other jobs lands on both
        seconds, steps = await framework_loop(fmt, reply_ids, episodes, tokens)
        fw.append(seconds)
        bare.append(await bare_loop(episodes, StoryEnv.turns))
    ms_fw, ms_bare = median(fw) * 1e3 / steps, median(bare) * 1e3 / steps
    progress(f"event loop ({name}): {ms_fw:.3f} ms per env step, bare {ms_bare:.4f}")
    return [name, f"{episodes}", f"{steps}", f"{median(fw):.2f}", f"{ms_fw:.3f}", f"{ms_bare:.4f}",
            f"{ms_fw - ms_bare:.3f}", "yes" if ms_fw < 1.0 else "NO"]


async def print_breakdown(name: str, tokens: int) -> None:
    from agentrl.data.chat import ChatFormat, load_tokenizer

    fmt = ChatFormat(load_tokenizer(resolve_model(name)))
    reply_ids = fmt.encode(" The keeper climbed the stairs again, counting every step." * (tokens // 10 + 2))
    print(table(["per env step", "µs"], await step_breakdown(fmt, reply_ids[:tokens]),
                f"Where an env step's Python time goes ({name} tokenizer, {tokens}-token turn)"), flush=True)
    print(flush=True)
