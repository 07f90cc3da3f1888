"""Warm sandboxes: started ahead of their calls, so a call pays for its code and not for the sandbox's
start (namespaces, mounts, the interpreter's own start-up: ~2/3 of a trivial call's time here).

Each warm sandbox has run nothing but sandbox_boot.py up to reading its call from stdin, and serves
exactly one call; taking one starts its replacement in the background. Throughput is unchanged (every
call still costs one sandbox start), latency drops. Sandboxes for merged and separate stdout/stderr
are kept apart (the pipes are set at start); a kind is warmed from its first call on. Each is in its
bound (sandbox_bound.py) from its start, at the server's limits; its call may lower them.
"""

from __future__ import annotations

import asyncio
import collections

from rewards.servers.sandbox_bound import Bounds
from rewards.servers.sandbox_isolation import Isolation
from rewards.servers.sandbox_run import Sandbox, SandboxLimits, start_sandbox


class WarmPool:
    """Up to `size` started sandboxes per kind (merge_stderr True / False); size 0 starts each call cold."""

    def __init__(self, isolation: Isolation, limits: SandboxLimits, size: int, bounds: Bounds) -> None:
        self.isolation, self.limits, self.size, self.bounds = isolation, limits, size, bounds
        self._ready: dict[bool, collections.deque[Sandbox]] = {True: collections.deque(),
                                                                    False: collections.deque()}
        self._starting: dict[bool, int] = {True: 0, False: 0}
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def fill(self, merge_stderr: bool = True) -> None:
        """Start sandboxes in the background until `size` are ready or starting."""
        while not self._closed and len(self._ready[merge_stderr]) + self._starting[merge_stderr] < self.size:
            self._starting[merge_stderr] += 1
            task = asyncio.get_running_loop().create_task(self._start_one(merge_stderr))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _start_one(self, merge_stderr: bool) -> None:
        try:
            sandbox = await start_sandbox(self.isolation, self.limits, merge_stderr, self.bounds)
        finally:
            self._starting[merge_stderr] -= 1
        if self._closed:
            await _discard(sandbox)
        else:
            self._ready[merge_stderr].append(sandbox)

    def take(self, merge_stderr: bool) -> Sandbox | None:
        """A warm sandbox never used before (None when none is ready: the caller starts one), and a
        replacement on its way."""
        ready = self._ready[merge_stderr]
        sandbox = None
        while ready and sandbox is None:
            sandbox = ready.popleft()
            if sandbox.proc.returncode is not None:  # ended while waiting (killed from outside): never reused
                sandbox.bound.close()
                sandbox = None
        self.fill(merge_stderr)
        return sandbox

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*self._tasks, return_exceptions=True)  # each kills what it started
        for ready in self._ready.values():
            while ready:
                await _discard(ready.popleft())


async def _discard(sandbox: Sandbox) -> None:
    sandbox.proc.kill()
    await sandbox.proc.wait()
    sandbox.proc.close()
    sandbox.bound.close()
