"""Code sandbox throughput and latency: the sandbox server's POST /call against a bare subprocess.

    python bench/sandbox.py [--calls 120 --concurrency 1 8 32 --isolation auto]

Starts `python -m rewards.servers.sandbox --port 0` as its own process (--max-concurrency set to the
largest concurrency measured, so both sides run as many processes at once), then for a trivial snippet
(`print(1)`) and a 100 ms one (`import time; time.sleep(0.1)`), at each concurrency, runs the same
number of calls two ways, side by side:
  * bare:    `/usr/bin/python3 -c CODE` as a subprocess of this process, no isolation;
  * sandbox: an HTTP call to the server, which runs the code in a fresh sandbox (bubblewrap namespaces,
             rlimits, clean env, tmpfs; one of its default 4 warm sandboxes when one is ready) and
             answers JSON.
Prints calls/s and p50 / p99 latency of each, and sandbox/bare p50 (the per-call overhead). Goals:
overhead <= 1.5x a bare subprocess at concurrency 1; >= 30 trivial sandbox calls/s.

    python bench/sandbox.py --totals

The call's bound as a whole instead (rewards.servers.sandbox_bound): one /run_code call forking N
children that each fill M MiB and hold it, for (N, M) in 1x512, 4x800, 16x256, 64x100, under a server
at its defaults (1024 MiB and 64 processes a call, --warm 0), once with the cgroup and once with the
watchdog (--bound watchdog). Prints the call's status and the most memory its processes held at once,
measured from outside: RssAnon + RssShmem of the server's descendants polled from /proc (pages a fork
shares count once per process), and the cgroup's own memory.max_usage_in_bytes where there is one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from _common import ROOT, print_host, progress, run_uvloop, table
from rewards.servers.sandbox_proc import ChildProcess

SNIPPETS = {"print(1)": ("print(1)", "1\n"), "sleep 100 ms": ("import time; time.sleep(0.1)", "")}
PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class Round:
    calls: int
    seconds: float
    latencies_s: list[float]

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds

    def percentile_ms(self, q: int) -> float:
        return statistics.quantiles(self.latencies_s, n=100, method="inclusive")[q - 1] * 1000


async def measure(one: Callable[[], Awaitable[None]], calls: int, concurrency: int) -> Round:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def timed() -> None:
        async with sem:
            t0 = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(timed() for _ in range(calls)))
    return Round(calls, time.perf_counter() - t0, latencies)


def bare_call(code: str, expected: str) -> Callable[[], Awaitable[None]]:
    """`python3 -c code`, started the way the server starts a sandbox (Popen's vfork: uvloop's own spawn
    forks, which costs more, and would flatter the sandbox)."""
    async def one() -> None:
        proc = await ChildProcess([PYTHON, "-c", code], {"PATH": "/usr/bin:/bin"}, merge_stderr=True).attach()
        proc.write_stdin(b"")
        out = await proc.stdout.read()
        assert await proc.wait() == 0 and out.decode() == expected, out
        proc.close()
    return one


def sandbox_call(client: httpx.AsyncClient, url: str, code: str, expected: str) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        response = await client.post(url + "/call", json={"name": "python", "arguments": {"code": code}})
        assert response.json() == {"content": expected, "is_error": False}, response.text
    return one


async def bench(url: str, args: argparse.Namespace) -> list[list[object]]:
    rows: list[list[object]] = []
    limits = httpx.Limits(max_connections=max(args.concurrency), max_keepalive_connections=max(args.concurrency))
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits) as client:
        for code, expected in SNIPPETS.values():  # warm the page cache and the server's connections
            await measure(bare_call(code, expected), 4, 4)
            await measure(sandbox_call(client, url, code, expected), 4, 4)
        for label, (code, expected) in SNIPPETS.items():
            for conc in args.concurrency:
                calls = max(args.calls if label == "print(1)" else args.calls // 2, 2 * conc)
                progress(f"{label} at concurrency {conc}: {calls} calls each way")
                bare = await measure(bare_call(code, expected), calls, conc)
                boxed = await measure(sandbox_call(client, url, code, expected), calls, conc)
                rows.append([label, conc, calls, f"{bare.calls_per_s:.1f}", f"{bare.percentile_ms(50):.1f}",
                             f"{bare.percentile_ms(99):.1f}", f"{boxed.calls_per_s:.1f}",
                             f"{boxed.percentile_ms(50):.1f}", f"{boxed.percentile_ms(99):.1f}",
                             f"{boxed.percentile_ms(50) / bare.percentile_ms(50):.2f}x"])
        stats = (await client.get(url + "/stats")).json()
    assert stats["failed"] == 0, stats
    return rows


TOTALS_CASES = ((1, 512), (4, 800), (16, 256), (64, 100))
FILL = """
import os, time
kids = []
for _ in range({n}):
    pid = os.fork()
    if pid == 0:
        x = b"x" * ({mib} << 20)
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
print(sum(os.waitpid(k, 0)[1] == 0 for k in kids), "of {n} held {mib} MiB")
"""


def _descendants_resident_mib(server: int) -> float:
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            parents[int(pid)] = int(stat[stat.rfind(b")") + 2:].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    total = 0
    for pid in parents:
        up = parents.get(pid)
        while up not in (None, 0, 1, server):
            up = parents.get(up)
        if up == server:
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += sum(int(line.split()[1]) for line in f if line.startswith(("RssAnon:", "RssShmem:")))
            except OSError:
                pass
    return total / 1024


def _server_cgroup_peak(server: int, reset: bool = False) -> str:
    """The server's memory cgroup's max_usage_in_bytes in MiB (cgroup v1; '-' without one); `reset` zeroes it."""
    try:
        own = next(line.split(":", 2)[2] for line in open(f"/proc/{server}/cgroup") if ":memory:" in line)
        path = f"/sys/fs/cgroup/memory{own.rstrip()}/agentrl-sandbox-{server}/memory.max_usage_in_bytes"
        if reset:
            with open(path, "w") as f:
                f.write("0")
        with open(path) as f:
            return f"{int(f.read()) / 2**20:.0f}"
    except (OSError, StopIteration):
        return "-"


def totals(args: argparse.Namespace) -> None:
    rows: list[list[object]] = []
    for bound in ("cgroup", "watchdog"):
        proc, url = start_server(args, ["--bound", bound, "--warm", "0", "--timeout", "30", "--cpu-s", "30"])
        try:
            health = httpx.get(url + "/health").json()
            for n, mib in TOTALS_CASES:
                progress(f"{bound}: {n} x {mib} MiB")
                _server_cgroup_peak(proc.pid, reset=True)
                peak, done = [0.0], threading.Event()

                def sample() -> None:
                    while not done.is_set():
                        peak[0] = max(peak[0], _descendants_resident_mib(proc.pid))

                sampler = threading.Thread(target=sample)
                sampler.start()
                try:
                    body = {"code": FILL.format(n=n, mib=mib), "language": "python"}
                    result = httpx.post(url + "/run_code", json=body, timeout=120).json()
                finally:
                    done.set()
                    sampler.join()
                said = result["message"] or result["run_result"]["stdout"].strip()
                rows.append([f"{health['bound']} ({health['isolation']})", f"{n} x {mib}", n * mib, 1024,
                             f"{peak[0]:.0f}", _server_cgroup_peak(proc.pid), result["status"], said[:60]])
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(table(["bound", "N x MiB", "tried MiB", "bound MiB", "peak RSS sampled", "cgroup max usage", "status",
                 "message / output"], rows,
                title=f"one call, N processes x M MiB each, {os.cpu_count()} cpus; peaks in MiB, from outside"))


def start_server(args: argparse.Namespace, extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "rewards.servers.sandbox", "--port", "0", "--isolation",
                             args.isolation, "--max-concurrency", str(max(args.concurrency)), *(extra or [])],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()  # "sandbox server listening on http://127.0.0.1:PORT"
    if not line.startswith("sandbox server listening on "):
        proc.kill()
        raise RuntimeError(f"sandbox server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=120, help="calls per cell for print(1); half for the sleep")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--isolation", default="auto", choices=["auto", "bwrap", "unshare"])
    parser.add_argument("--totals", action="store_true", help="the call's bound as a whole instead (see above)")
    args = parser.parse_args()
    if args.totals:
        totals(args)
        return
    proc, url = start_server(args)
    try:
        isolation = httpx.get(url + "/health").json()["isolation"]
        rows = run_uvloop(bench(url, args))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(table(["snippet", "conc", "calls", "bare calls/s", "bare p50 ms", "bare p99 ms", "sandbox calls/s",
                 "sandbox p50 ms", "sandbox p99 ms", "p50 sandbox/bare"], rows,
                title=f"sandbox ({isolation}) vs bare `{PYTHON} -c`, {os.cpu_count()} cpus, server "
                      f"--max-concurrency {max(args.concurrency)}"))
    trivial = [r for r in rows if r[0] == "print(1)"]
    c1 = next((r for r in trivial if r[1] == 1), None)
    best = max(float(r[6]) for r in trivial)
    if c1 is not None:
        print(f"overhead at concurrency 1 (trivial): {c1[9]} a bare subprocess (goal <= 1.5x)")
    print(f"trivial sandbox calls/s, best concurrency: {best:.1f} (goal >= 30)")


if __name__ == "__main__":
    print_host()
    main()
