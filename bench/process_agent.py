"""What running an agent as its own process costs agentrl per episode (ProcessAgentEnv), at 1, 8 and 32
episodes at once, beside the program's own start-up.

    .venv/bin/python bench/process_agent.py [--episodes 64] [--concurrency 1 8 32] [--json out.json]

The program (written to a temp file) is a standard-library agent: it reads the task on stdin, makes one
chat-completions request to $OPENAI_BASE_URL with urllib, writes its reward file and exits. The engine is
tests/fake_engine.ScriptedEngine, which answers at once: generation is not measured, only agentrl's
cost around the process (the endpoint, the session, the spawn, the group kill, the reward file, the
working directory). The loop is uvloop, as in train.py. Per episode:

  spawn -> first request   from just before the exec to the engine receiving the request; it holds the
                           program's own start-up (interpreter, imports, reading stdin, connecting)
  bare start-up            the same program with `bare`, spawned the same way (Popen, own session, pipes,
                           the task on stdin) at the same concurrency: spawn -> its stdout closed, which it
                           does where `play` would send its request (after its imports and reading the task)
  exit -> scored           from the process's exit being seen to the episode returned, scored
  agentrl overhead         (spawn -> first request) - (bare start-up), + (exit -> scored), each at p50
  exec call                the part of spawn -> first request spent in Popen (in a thread, off the loop)

Goal: overhead <= 50 ms p50 (issue 76). Progress on stderr; the table and a JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import print_host, progress, run_uvloop, table  # noqa: E402

PROGRAM = r'''
import json, os, sys, urllib.request
task = json.load(sys.stdin)
if sys.argv[1] == "bare":  # started, imported, read its task: where `play` would send its request
    os.close(1)  # its stdout's EOF is the mark
    sys.exit(0)
body = {"model": "agentrl", "messages": [{"role": "user", "content": f"[ep {task['n']}] What is 2 + 3?"}]}
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
with urllib.request.urlopen(request, timeout=60) as response:
    reply = json.load(response)["choices"][0]["message"]["content"]
with open(os.environ["AGENTRL_REWARD_FILE"], "w") as f:
    json.dump({"reward": float(reply == "5")}, f)
'''


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


@dataclasses.dataclass
class Timings:
    """Milliseconds per episode."""

    to_first_request: list[float]
    spawn_call: list[float]  # Popen until the child exec'd (in a thread)
    exit_to_scored: list[float]
    bare: list[float]
    failed: int


async def bare_startups(argv: list[str], n: int, concurrency: int) -> list[float]:
    """Spawn -> the bare program's mark, spawned as run_child spawns (Popen in a thread, own session, pipes)."""
    from agentrl.rollout.process_agent.fds import read_tail, wait_exit

    gate = asyncio.Semaphore(concurrency)

    async def one() -> float:
        async with gate:
            t0 = time.monotonic()
            proc = await asyncio.to_thread(subprocess.Popen, [*argv, "bare"], start_new_session=True, bufsize=0,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            proc.stdin.write(b'{"id": "b", "n": 0}\n')
            proc.stdin.close()
            await read_tail(proc.stdout.fileno(), bytearray(), 64)
            ready = (time.monotonic() - t0) * 1e3
            await wait_exit(proc)
            proc.stdout.close()
            return ready

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def measure(tokenizer: Any, program: Path, n: int, concurrency: int) -> Timings:
    from agentrl.config import RolloutConfig, ServerConfig
    from agentrl.data.chat import ChatFormat
    from agentrl.rollout.agent_episode import make_server
    from agentrl.rollout.episode import EpisodeSpec
    from agentrl.rollout.pool import RolloutPool
    from agentrl.rollout.process_agent import ProcessAgentEnv
    from tests.fake_engine import ScriptedEngine

    children: dict[int, Any] = {}
    requests: list[tuple[float, list[int]]] = []

    class Timed(ProcessAgentEnv):
        async def run(self, client: Any, task: dict[str, Any]) -> Any:
            try:
                return await super().run(client, task)
            finally:
                children[task["n"]] = self.last_child

    class Engine(ScriptedEngine):
        async def generate(self, prompt_ids: list[int], *args: Any, **kwargs: Any) -> Any:
            requests.append((time.monotonic(), prompt_ids))  # decoded after the run, off the measured path
            return await super().generate(prompt_ids, *args, **kwargs)

    engine = Engine(tokenizer, lambda prompt, index: "5")
    cfg = RolloutConfig(max_turns=2, max_tokens_per_turn=8, episode_timeout_s=120.0, temperature=1.0)
    kwargs = {"command": ["{python}", "-I", str(program), "play"]}
    spec = EpisodeSpec(Timed, kwargs, ChatFormat(tokenizer), cfg, 512)
    spec = dataclasses.replace(spec, server=make_server(spec, engine, ServerConfig()))
    await spec.server.start()
    scored: dict[int, float] = {}
    try:
        pool, gate = RolloutPool(engine, spec), asyncio.Semaphore(concurrency)

        async def episode(i: int) -> Any:
            async with gate:
                ep = await pool.episode({"id": f"b{i}", "n": i}, i, seed=i)
                scored[i] = time.monotonic()
                return ep

        episodes = await asyncio.gather(*(episode(i) for i in range(n)))
    finally:
        await spec.server.stop()
    first: dict[int, float] = {}
    for at, prompt in requests:
        text = tokenizer.decode(prompt)
        i = int(text.split("[ep ", 1)[1].split("]", 1)[0])
        first[i] = min(first.get(i, at), at)
    ok = [i for i, ep in enumerate(episodes) if ep.status == "ok" and i in first and children.get(i)]
    bare = await bare_startups([sys.executable, "-I", str(program)], n, concurrency)
    return Timings([(first[i] - children[i].spawned_at) * 1e3 for i in ok],
                   [(children[i].started_at - children[i].spawned_at) * 1e3 for i in ok],
                   [(scored[i] - children[i].exited_at) * 1e3 for i in ok], bare, n - len(ok))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=64, help="episodes per concurrency level")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    print_host()
    from agentrl.config import DefaultModelConfig
    from agentrl.models.default import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(DefaultModelConfig(), Path(tmp))
        program = Path(tmp) / "agent.py"
        program.write_text(PROGRAM)
        rows, figures = [], []
        for c in args.concurrency:
            progress(f"concurrency {c}: {args.episodes} episodes")
            t = run_uvloop(measure(tokenizer, program, args.episodes, c))
            first, exit_, bare = (statistics.median(t.to_first_request), statistics.median(t.exit_to_scored),
                                  statistics.median(t.bare))
            overhead = first - bare + exit_
            figures.append({"concurrency": c, "episodes": args.episodes, "failed": t.failed,
                            "spawn_to_first_request_ms": {"p50": first, "p90": pct(t.to_first_request, 0.9)},
                            "exit_to_scored_ms": {"p50": exit_, "p90": pct(t.exit_to_scored, 0.9)},
                            "bare_startup_ms": {"p50": bare, "p90": pct(t.bare, 0.9)},
                            "spawn_call_ms": {"p50": statistics.median(t.spawn_call), "p90": pct(t.spawn_call, 0.9)},
                            "overhead_p50_ms": overhead})
            rows.append([c, args.episodes - t.failed, f"{first:.1f} / {pct(t.to_first_request, 0.9):.1f}",
                         f"{bare:.1f} / {pct(t.bare, 0.9):.1f}", f"{exit_:.1f} / {pct(t.exit_to_scored, 0.9):.1f}",
                         f"{statistics.median(t.spawn_call):.1f}", f"{overhead:.1f}", "yes" if overhead <= 50 else "NO"])
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"this process's peak RSS {rss_mb:.0f} MB (a fork copies its page tables); load average "
          f"{os.getloadavg()[0]:.2f} (1 min) at the end; engine: tests/fake_engine.ScriptedEngine "
          "(answers at once: agentrl's cost, not generation's)")
    print(table(["concurrency", "ok", "spawn->1st request p50/p90", "bare start-up p50/p90", "exit->scored p50/p90",
                 "exec call p50", "overhead p50", "<= 50 ms"], rows, "process-agent overhead per episode, ms"))
    print(json.dumps({"process_agent_overhead": figures}))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
