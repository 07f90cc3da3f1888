"""A sandbox call bounded as a whole (rewards.servers.sandbox_bound): memory, processes and CPU of all its
processes together, under a cgroup (this machine: root, cgroup v1) and under the watchdog fallback
(`--bound watchdog`; a server that is not root falls back to it by itself: tests/test_sandbox_limits.py).
Real servers, real processes; the memory each call's processes hold is sampled from outside, from /proc.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from rewards.servers.sandbox_bound import WATCHDOG_TICK_S
from tests.test_sandbox import ROOT, listening

CALL_MB, CHILD_MB, CHILDREN = 256, 200, 4  # 800 MiB tried against 256
BASE = ["--call-memory-mb", str(CALL_MB), "--memory-mb", "512", "--processes", "16", "--timeout", "20",
        "--cpu-s", "20", "--warm", "1"]
# What the outside sample may show past the bound, and why. Each child's private pages at the fork (the
# parent's ~10 MiB of python) show in every child's RSS though the kernel holds them once. The watchdog also
# lets a call allocate for up to two ticks (one to the next scan, one for the scan itself) on every CPU;
# 4 GiB/s is three times the first-touch rate of one CPU here (`b"x" * (512 << 20)`: 1.2-1.4 GiB/s).
COW_MB = 16
FILL_MIB_S = 4096
SLACK_MB = {"cgroup": CHILDREN * COW_MB,
            "watchdog": CHILDREN * COW_MB + int(FILL_MIB_S * 2 * WATCHDOG_TICK_S * (os.cpu_count() or 1))}

FILL = f"""
import os, time
kids = []
for _ in range({CHILDREN}):
    pid = os.fork()
    if pid == 0:
        x = b"x" * ({CHILD_MB} << 20)
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
print([os.waitpid(k, 0)[1] for k in kids])
"""


@pytest.fixture(scope="module")
def servers():
    """name -> (url, pid): the cgroup bound, the watchdog, and a cgroup one whose calls share 512 MiB."""
    if os.geteuid() != 0:
        pytest.skip("a cgroup needs a root server here (the watchdog runs as nobody in test_sandbox_limits.py)")
    options = {"cgroup": [*BASE, "--bound", "cgroup"],
               "watchdog": [*BASE, "--bound", "watchdog", "--call-cpus", "0.25"],
               "shared": [*BASE, "--bound", "cgroup", "--server-memory-mb", "512", "--max-concurrency", "8"]}
    procs = {name: subprocess.Popen([sys.executable, "-m", "rewards.servers.sandbox", "--port", "0", *args], cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, args in options.items()}
    with listening(procs) as urls:
        yield urls


class Sampler:
    """The most RssAnon + RssShmem that `root`'s descendants held at once, polled from /proc in a thread."""

    def __init__(self, root: int) -> None:
        self.root, self.peak_mb, self._stop = root, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            parents = {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_bytes()
                    parents[int(pid)] = int(stat[stat.rfind(b")") + 2:].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
            total = 0
            for pid in parents:
                up = parents.get(pid)
                while up not in (None, 0, 1, self.root):
                    up = parents.get(up)
                if up == self.root:
                    try:
                        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                            if line.startswith(("RssAnon:", "RssShmem:")):
                                total += int(line.split()[1]) << 10
                    except OSError:
                        pass
            self.peak_mb = max(self.peak_mb, total / 2**20)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_code(url: str, code: str) -> dict:
    return httpx.post(url + "/run_code", json={"code": code, "language": "python"}, timeout=60).json()


def call(url: str, code: str) -> dict:
    return httpx.post(url + "/call", json={"name": "python", "arguments": {"code": code}}, timeout=60).json()


@pytest.mark.parametrize("bound", ["cgroup", "watchdog"])
def test_memory_over_the_call_total_ends_the_call(servers, bound):
    url, pid = servers[bound]
    assert httpx.get(url + "/health").json()["bound"].startswith(bound)  # "cgroup v1" here; v2 where it is
    with Sampler(pid) as sampler:
        result = run_code(url, FILL)
    note = f"{CALL_MB} MiB in all; killed"
    assert result["status"] == "Failed" and result["message"] == f"memory limit: the call's processes used over {note}"
    assert (result["run_result"]["status"], result["run_result"]["return_code"]) == ("Error", -9)
    assert result["run_result"]["stderr"].endswith(f"[memory limit: the call's processes used over {note}]")
    assert 0 < sampler.peak_mb <= CALL_MB + SLACK_MB[bound], (sampler.peak_mb, bound)
    assert call(url, "print(1)") == {"content": "1\n", "is_error": False}
    assert httpx.get(url + "/stats").json()["memory_limit"] >= 1


@pytest.mark.parametrize("bound", ["cgroup", "watchdog"])
def test_too_many_processes_ends_the_call(servers, bound):
    """Forks refused past the bound (the cgroup's pids.max, or RLIMIT_NPROC a few past it) end the call. The
    watchdog sees the count on a tick: a call that is refused and exits within one tick (~20 ms) ends with
    its own error (EAGAIN) instead; one that goes on, as a fork bomb does, is caught."""
    url, _ = servers[bound]
    code = ("import os, time\nfor _ in range(40):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n"
            "            os._exit(0)\n    except OSError:\n        pass\ntime.sleep(10)")
    result = call(url, code)
    assert result["is_error"]
    assert result["content"].endswith("[process limit: the call tried to run over 16 processes and threads; killed]")
    under = call(url, "import os\nfor _ in range(8):\n    if os.fork() == 0:\n        os._exit(0)\nprint('ok')")
    assert under == {"content": "ok\n", "is_error": False}


def test_watchdog_cpu_seconds_of_the_call_in_all(servers):
    """CPU: a cgroup's quota throttles (a spinning call waits, then times out); the watchdog has no throttle
    and ends the call once its processes used --call-cpus x the wall time in all (0.25 x 4 s here: 1 CPU
    second, which four spinning processes use in a quarter of the wall time on one free CPU)."""
    url, _ = servers["watchdog"]
    code = "import os\nfor _ in range(2): os.fork()\nwhile True: pass"
    body = {"code": code, "language": "python", "run_timeout": 4}
    result = httpx.post(url + "/run_code", json=body, timeout=60).json()
    assert result["status"] == "Failed" and result["message"].startswith("CPU limit: the call's processes used "
                                                                         "over 1.0 CPU seconds in all"), result


def test_concurrent_calls_share_the_server_total(servers):
    """--server-memory-mb 512 and calls of 256 MiB each: at most two run at once, the others wait their turn;
    every call gets its answer."""
    url, pid = servers["shared"]
    code = "import time\nx = b'x' * (150 << 20)\ntime.sleep(0.5)\nprint(len(x) >> 20)"

    async def run() -> list[dict]:
        async with httpx.AsyncClient(timeout=60) as client:
            return [r.json() for r in await asyncio.gather(*(client.post(url + "/call", json={
                "name": "python", "arguments": {"code": code}}) for _ in range(5)))]

    with Sampler(pid) as sampler:
        results = asyncio.run(run())
    assert results == [{"content": "150\n", "is_error": False}] * 5
    stats = httpx.get(url + "/stats").json()
    assert stats["max_memory_held_mb"] == 512 and stats["max_in_flight"] == 2 and stats["waiting_for_memory"] == 0
    assert sampler.peak_mb <= 512 + 2 * COW_MB, sampler.peak_mb


def test_sandbox_binds_only_the_interpreters_runtime():
    """An interpreter outside /usr (a copy of the system one with its stdlib, in a prefix of its own): the
    sandbox sees its binary and its lib/python3.X, not a file beside them in the prefix."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if not Path(f"/usr/lib/{version}/os.py").exists() or not Path(f"/usr/bin/{version}").exists():
        pytest.skip(f"no system {version} to copy")
    prefix = Path(tempfile.mkdtemp(prefix="agentrl-prefix-", dir="/var/tmp"))  # /tmp is the sandbox's own tmpfs
    try:
        prefix.chmod(0o755)
        (prefix / "bin").mkdir()
        shutil.copy2(f"/usr/bin/{version}", prefix / "bin")
        shutil.copytree(f"/usr/lib/{version}", prefix / "lib" / version, symlinks=True,
                        ignore=shutil.ignore_patterns("test", "__pycache__", "dist-packages", "site-packages"))
        (prefix / "share").mkdir()
        (prefix / "share" / "notes.txt").write_text("not the runtime's")
        (prefix / "secret.txt").write_text("not the runtime's")
        code = ("import os, sys, json\nprint(sys.prefix, sorted(os.listdir(sys.prefix)), "
                f"os.path.exists({str(prefix / 'secret.txt')!r}), json.dumps([1]))")
        proc = subprocess.Popen([sys.executable, "-m", "rewards.servers.sandbox", "--port", "0", "--warm", "0",
                                 "--python", str(prefix / "bin" / version)], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        with listening({"runtime": proc}) as urls:
            out = call(urls["runtime"][0], code)
        assert out == {"content": f"{prefix} ['bin', 'lib'] False [1]\n", "is_error": False}
    finally:
        shutil.rmtree(prefix)
