"""Load benchmark (not a test) for HttpVerifier against the reference verifier on loopback.

    python bench/verifier_load.py [--calls 2000 --cap 64 --rounds 3 --delay-ms 0]

Starts `python -m rewards.servers.verifier --port 0` as a subprocess (its own core and event loop,
so the client's cost is not hidden inside the server's), then alternates rounds of
  * framework: N episodes through HttpVerifier (retries, schema validation, stats, semaphore), and
  * raw:       the same N request bodies through a bare httpx.AsyncClient with the same cap,
and prints calls/s for each, their ratio (framework/raw, medians over rounds), the client CPU time
per call, and the server's observed max concurrent requests, which must not exceed --cap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.types import Episode  # noqa: E402
from rewards.http_verifier import HttpVerifier, VerifierConfig, episode_key  # noqa: E402
from rewards.rules import last_assistant_text  # noqa: E402


@dataclass
class Round:
    name: str
    calls: int
    ok: int
    seconds: float
    cpu_s: float  # client process CPU time
    server_max_in_flight: int
    client_max_in_flight: int = -1

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds


def make_episodes(n: int, tag: str) -> list[Episode]:
    episodes = []
    for i in range(n):
        answer = i % 97
        said = answer if i % 2 else answer + 1  # half right, half wrong
        messages = [{"role": "user", "content": f"task {i}: what is {answer}?"},
                    {"role": "assistant", "content": f"Let me think. The answer is {said}."}]
        episodes.append(Episode(task_id=f"{tag}-{i}", group_id=i // 8, messages=messages,
                                info={"task": {"answer": str(answer)}}))
    return episodes


async def server_stats(client: httpx.AsyncClient, base: str, reset: bool = False) -> dict:
    response = await (client.post(base + "/stats/reset") if reset else client.get(base + "/stats"))
    return response.json()


async def run_framework(base: str, episodes: list[Episode], cap: int, admin: httpx.AsyncClient) -> Round:
    await server_stats(admin, base, reset=True)
    config = VerifierConfig(url=base + "/verify", max_concurrency=cap, max_retries=3)
    t0, c0 = time.perf_counter(), time.process_time()
    async with HttpVerifier(config) as verifier:
        results = await asyncio.gather(*(verifier(e) for e in episodes))
        client_max = verifier.stats().max_in_flight
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    ok = sum(r.ok and r.value == float(int(e.task_id.split("-")[-1]) % 2) for r, e in zip(results, episodes))
    server = await server_stats(admin, base)
    return Round("framework", len(episodes), ok, seconds, cpu, server["max_in_flight"], client_max)


async def run_raw(base: str, episodes: list[Episode], cap: int, admin: httpx.AsyncClient) -> Round:
    await server_stats(admin, base, reset=True)
    bodies = [(episode_key(e), json.dumps({"episode_id": episode_key(e), "task": e.info["task"],
                                          "messages": e.messages,
                                          "completion": last_assistant_text(e.messages)}).encode())
              for e in episodes]
    sem = asyncio.Semaphore(cap)
    t0, c0 = time.perf_counter(), time.process_time()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=cap, max_keepalive_connections=cap),
                                 timeout=httpx.Timeout(30.0)) as client:
        async def one(key: str, body: bytes) -> float:
            async with sem:
                response = await client.post(base + "/verify", content=body, headers={
                    "Content-Type": "application/json", "Idempotency-Key": key})
                return response.json()["reward"]
        rewards = await asyncio.gather(*(one(k, b) for k, b in bodies))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    ok = sum(r == float(int(e.task_id.split("-")[-1]) % 2) for r, e in zip(rewards, episodes))
    server = await server_stats(admin, base)
    return Round("raw", len(episodes), ok, seconds, cpu, server["max_in_flight"])


def start_server(delay_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "rewards.servers.verifier", "--port", "0",
                             "--delay-ms", str(delay_ms)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()  # "verifier listening on http://127.0.0.1:PORT"
    if not line.startswith("verifier listening on "):
        proc.kill()
        raise RuntimeError(f"verifier did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1]


async def bench(args: argparse.Namespace, base: str) -> list[tuple[Round, Round]]:
    pairs = []
    async with httpx.AsyncClient() as admin:
        await run_raw(base, make_episodes(min(200, args.calls), "warm-raw"), args.cap, admin)
        await run_framework(base, make_episodes(min(200, args.calls), "warm-fw"), args.cap, admin)
        for r in range(args.rounds):
            raw = await run_raw(base, make_episodes(args.calls, f"raw{r}"), args.cap, admin)
            fw = await run_framework(base, make_episodes(args.calls, f"fw{r}"), args.cap, admin)
            pairs.append((fw, raw))
    return pairs


def report(args: argparse.Namespace, pairs: list[tuple[Round, Round]], loop_name: str) -> bool:
    print(f"verifier_load: {args.calls} calls x {args.rounds} rounds, cap {args.cap}, server delay "
          f"{args.delay_ms} ms, client loop {loop_name}, server = reference verifier subprocess, {os.cpu_count()} cpus")
    print(f"{'round':>5} {'raw calls/s':>12} {'framework calls/s':>18} {'ratio':>6} "
          f"{'raw cpu us/call':>16} {'fw cpu us/call':>15} {'server max in flight (raw/fw)':>30}")
    for i, (fw, raw) in enumerate(pairs):
        print(f"{i:>5} {raw.calls_per_s:>12.0f} {fw.calls_per_s:>18.0f} {fw.calls_per_s / raw.calls_per_s:>6.3f} "
              f"{raw.cpu_s / raw.calls * 1e6:>16.0f} {fw.cpu_s / fw.calls * 1e6:>15.0f} "
              f"{f'{raw.server_max_in_flight}/{fw.server_max_in_flight}':>30}")
    fw_rate = statistics.median(fw.calls_per_s for fw, _ in pairs)
    raw_rate = statistics.median(raw.calls_per_s for _, raw in pairs)
    fw_cpu = statistics.median(fw.cpu_s / fw.calls for fw, _ in pairs)
    raw_cpu = statistics.median(raw.cpu_s / raw.calls for _, raw in pairs)
    server_max = max(max(fw.server_max_in_flight, raw.server_max_in_flight) for fw, raw in pairs)
    client_max = max(fw.client_max_in_flight for fw, _ in pairs)
    completed = min(fw.ok for fw, _ in pairs)
    within = server_max <= args.cap and client_max <= args.cap
    print(f"framework (HttpVerifier): {fw_rate:.0f} calls/s (median), all-completed {completed}/{args.calls} "
          f"(lowest round, scored correctly), client max in flight {client_max}")
    print(f"raw httpx:                {raw_rate:.0f} calls/s (median), all-completed "
          f"{min(raw.ok for _, raw in pairs)}/{args.calls}")
    print(f"max in flight seen by server: {server_max} (cap {args.cap}: {'ok' if within else 'EXCEEDED'})")
    print(f"framework/raw throughput ratio: {fw_rate / raw_rate:.3f}   "
          f"client CPU per call framework/raw: {fw_cpu * 1e6:.0f}/{raw_cpu * 1e6:.0f} us = {fw_cpu / raw_cpu:.2f}x")
    return within and completed == args.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cap", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="server-side simulated scoring time")
    args = parser.parse_args()
    try:
        import uvloop

        run, loop_name = uvloop.run, "uvloop"
    except ImportError:
        run, loop_name = asyncio.run, "asyncio"
    proc, base = start_server(args.delay_ms)
    try:
        pairs = run(bench(args, base))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    sys.exit(0 if report(args, pairs, loop_name) else 1)


if __name__ == "__main__":
    main()
