"""What bounds a sandbox call as a whole (all its processes together, not each one): its memory, its
processes and threads, its CPU. Chosen once at start-up (`choose`), which logs one line naming it.

  * cgroup (v2, else v1; sandbox_cgroup.py): each sandbox in a cgroup of its own with memory, pids and cpu
    limits, all under one for the server. The kernel enforces them: memory over the limit is an OOM kill
    inside the sandbox (never of a process elsewhere), a fork over pids.max fails with EAGAIN, CPU over
    the quota waits. The call is then ended whole and reported (`LimitHit`): the tick sees the cgroup's
    oom_kill or refused-fork counter move, and once more when the call ends.
  * watchdog (no writable cgroup: a server that is not root, a kernel without the controllers, or
    `--bound watchdog`): every `tick_s` it sums the sandbox's process tree from /proc (sandbox_watch.py)
    and kills the whole tree when its memory, task count or CPU seconds are over. Its memory bound is the
    call's minus /tmp's and /dev/shm's sizes (tmpfs pages no process's RSS shows); between two ticks a
    call can overshoot by what it allocates in one tick (the per-process RLIMIT_AS caps each process;
    RLIMIT_NPROC stops a fork bomb a few processes past the bound).

The sandbox's own launcher processes (bwrap's two, unshare's two) count in the cgroup, and are added to the
task limit so the call's code gets `processes` of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
from dataclasses import dataclass
from typing import Literal

from rewards.servers import sandbox_cgroup as cg
from rewards.servers.sandbox_watch import ProcessTable

log = logging.getLogger(__name__)
BoundName = Literal["auto", "cgroup", "watchdog"]
CGROUP_TICK_S = 0.05  # reads two small counter files per running call
WATCHDOG_TICK_S = 0.02  # one /proc scan per tick for all calls (sandbox_watch.py)
NPROC_SLACK = 8  # RLIMIT_NPROC past the bound: the hard stop behind the cgroup's or the watchdog's
# what a started sandbox waiting for its call may hold (3 MiB measured here, cgroup v1: the interpreter's
# pages are cached already, charged elsewhere)
IDLE_SANDBOX_MB = 32


@dataclass(frozen=True)
class CallTotals:
    """One call's bounds as a whole: memory (its /tmp and /dev/shm included), tasks of its code, CPU."""

    memory_bytes: int
    tmpfs_bytes: int  # /tmp + /dev/shm sizes: in the cgroup's charge, outside the watchdog's RSS sum
    tasks: int
    cpus: float
    wall_s: float


@dataclass(frozen=True)
class LimitHit:
    """A call ended for going over its bound as a whole; `text` is the line its response carries."""

    kind: Literal["memory", "processes", "cpu"]
    text: str


def _hit(kind: Literal["memory", "processes", "cpu"], totals: CallTotals) -> LimitHit:
    text = {"memory": f"memory limit: the call's processes used over {totals.memory_bytes >> 20} MiB in all",
            "processes": f"process limit: the call tried to run over {totals.tasks} processes and threads",
            "cpu": f"CPU limit: the call's processes used over {totals.cpus * totals.wall_s:.1f} CPU seconds "
                   f"in all ({totals.cpus:g} CPUs for {totals.wall_s:g} s)"}[kind]
    return LimitHit(kind, text + "; killed")


class CallBound:
    """One sandbox's bound: `wrap` its command line, `attach` its pid once started, `set_totals` when its call
    comes, `check` every `tick_s` (a LimitHit: kill it), `close` after it ended."""

    tick_s = CGROUP_TICK_S

    def __init__(self, totals: CallTotals, launcher_tasks: int) -> None:
        self.totals, self.launcher_tasks, self.pid = totals, launcher_tasks, 0

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def attach(self, pid: int) -> None:
        self.pid = pid

    def set_totals(self, totals: CallTotals) -> None:
        self.totals = totals

    def check(self) -> LimitHit | None:
        return None

    def peak_bytes(self) -> int | None:
        return None

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass


class CgroupCall(CallBound):
    def __init__(self, totals: CallTotals, launcher_tasks: int, cgroup: cg.Hierarchy) -> None:
        super().__init__(totals, launcher_tasks)
        self.cgroup = cgroup
        for folder in cgroup.roots:
            folder.mkdir()
        cg.set_limits(cgroup, cg.Limits(totals.memory_bytes, totals.tasks + launcher_tasks, totals.cpus))

    def wrap(self, argv: list[str]) -> list[str]:
        return cg.enter_argv(self.cgroup, argv)

    def set_totals(self, totals: CallTotals) -> None:
        if totals.memory_bytes != self.totals.memory_bytes:
            cg.set_memory(self.cgroup, totals.memory_bytes)
        super().set_totals(totals)

    def check(self) -> LimitHit | None:
        if cg.oom_kills(self.cgroup):
            return _hit("memory", self.totals)
        if cg.refused_forks(self.cgroup):
            return _hit("processes", self.totals)
        return None

    def peak_bytes(self) -> int | None:
        return cg.peak_bytes(self.cgroup)

    def kill(self) -> None:
        cg.kill_all(self.cgroup)

    def close(self) -> None:
        self.kill()
        if not cg.remove(self.cgroup):
            STALE.append(self.cgroup)  # its last processes are still exiting: removed on a later close


STALE: list[cg.Hierarchy] = []


class WatchedCall(CallBound):
    tick_s = WATCHDOG_TICK_S

    def __init__(self, totals: CallTotals, launcher_tasks: int, table: ProcessTable) -> None:
        super().__init__(totals, launcher_tasks)
        self.table, self.peak = table, 0

    def check(self) -> LimitHit | None:
        if not self.pid:
            return None
        usage = self.table.tree(self.pid)
        self.peak = max(self.peak, usage.memory_bytes)
        if usage.memory_bytes > self.totals.memory_bytes - self.totals.tmpfs_bytes:
            return _hit("memory", self.totals)
        if usage.tasks - self.launcher_tasks > self.totals.tasks:
            return _hit("processes", self.totals)
        if usage.cpu_s > self.totals.cpus * self.totals.wall_s:
            return _hit("cpu", self.totals)
        return None

    def peak_bytes(self) -> int | None:
        return self.peak

    def kill(self) -> None:
        if self.pid:
            self.table.max_age_s, age = 0.0, self.table.max_age_s  # a fresh scan: what forked since the last
            try:
                pids = self.table.tree(self.pid).pids
            finally:
                self.table.max_age_s = age
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


class Bounds:
    """The mechanism the server uses for every sandbox; `new_call` gives one sandbox's CallBound."""

    def __init__(self, name: str, server_cgroup: cg.Hierarchy | None = None, why_not: str = "") -> None:
        self.name, self.server_cgroup, self.why_not = name, server_cgroup, why_not
        self._numbers = itertools.count()
        self._table = ProcessTable(WATCHDOG_TICK_S / 2)

    def new_call(self, totals: CallTotals, launcher_tasks: int) -> CallBound:
        while STALE and cg.remove(STALE[0]):
            STALE.pop(0)
        if self.server_cgroup is None:
            return WatchedCall(totals, launcher_tasks, self._table)
        return CgroupCall(totals, launcher_tasks, self.server_cgroup.child(f"call-{next(self._numbers)}"))

    def close(self) -> None:
        if self.server_cgroup is not None:
            for stale in STALE:
                cg.kill_all(stale)
                cg.remove(stale)
            STALE.clear()
            cg.remove(self.server_cgroup)


def choose(name: BoundName, python: str, server_memory_bytes: int) -> Bounds:
    """`cgroup` (or `auto`, falling back to the watchdog with the reason logged) or `watchdog`; the server's
    cgroup limited to `server_memory_bytes` (admission keeps the calls' own bounds inside it)."""
    if name == "watchdog":
        return Bounds("watchdog", why_not="--bound watchdog")
    try:
        server = cg.find()
        why = cg.probe(server, python)
        if not why:
            cg.set_memory(server, server_memory_bytes)
            return Bounds(f"cgroup v{server.version}", server)
        cg.remove(server)
    except cg.NoCgroup as exc:
        why = str(exc)
    except OSError as exc:
        why = f"{exc.filename}: {exc.strerror}"
    if name == "cgroup":
        raise cg.NoCgroup(f"--bound cgroup: {why}")
    return Bounds("watchdog", why_not=why)


def describe(bounds: Bounds, totals: CallTotals, server_memory_mb: int) -> str:
    """The start-up line."""
    call = (f"each call at most {totals.memory_bytes >> 20} MiB in all, {totals.tasks} processes and threads, "
            f"{totals.cpus:g} CPUs; all calls together at most {server_memory_mb} MiB")
    if bounds.server_cgroup is not None:
        where = bounds.server_cgroup.roots[0] if bounds.server_cgroup.version == 2 else \
            bounds.server_cgroup.folders["memory"]
        return f"sandbox bound: {bounds.name} ({where}): {call}"
    return (f"sandbox bound: watchdog, the call's process tree polled every {WATCHDOG_TICK_S * 1000:.0f} ms "
            f"(no cgroup: {bounds.why_not}): {call}")
