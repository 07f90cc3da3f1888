"""The process trees of running sandboxes, read from /proc: what the watchdog bound (no cgroup) sums, and
what bench/sandbox.py measures from outside.

A sandbox's tree is its outer process (bwrap, unshare or the python itself) and every descendant, found by
parent pid: a daemon the code double-forks is re-parented to the pid namespace's init, which is in the
tree (with `--isolation none` it leaves the tree: no pid namespace). This kernel has no
/proc/PID/task/TID/children, so one scan of /proc/*/stat per tick serves every running call
(`ProcessTable.snapshot` is shared; ~3 ms for 80 processes on this machine's 2 cores).

Memory is RssAnon + RssShmem from /proc/PID/status per process: what cannot be dropped under pressure
(file pages of the interpreter and its libraries can). Pages a fork shares copy-on-write count once per
process, so the sum errs high, never low. CPU is utime + stime + cutime + cstime of each live process:
a reaped child's time is in its parent's cutime, so the sum over live processes is the tree's total.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    tasks: int  # threads
    cpu_s: float  # own and reaped children's user + system time
    zombie: bool


@dataclass(frozen=True)
class TreeUsage:
    pids: tuple[int, ...]
    tasks: int
    memory_bytes: int
    cpu_s: float


def _stat(pid: str) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()  # the name (in parentheses) may hold spaces
    ticks = sum(int(v) for v in rest[11:15])
    return ProcStat(int(rest[1]), int(rest[17]), ticks / CLOCK_TICKS, rest[0] == b"Z")


def resident_bytes(pid: int) -> int:
    """RssAnon + RssShmem of one process (0 when it is gone)."""
    total = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith((b"RssAnon:", b"RssShmem:")):
                    total += int(line.split()[1]) << 10
    except OSError:
        return 0
    return total


class ProcessTable:
    """pid -> ProcStat for every process, rescanned at most every `max_age_s` however many calls ask."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._at = -1.0
        self._table: dict[int, ProcStat] = {}
        self._children: dict[int, list[int]] = {}

    def snapshot(self) -> dict[int, list[int]]:
        """ppid -> child pids, fresh enough."""
        now = time.monotonic()
        if now - self._at >= self.max_age_s:
            table = {int(pid): st for pid in os.listdir("/proc") if pid.isdigit() and (st := _stat(pid))}
            children: dict[int, list[int]] = {}
            for pid, st in table.items():
                children.setdefault(st.ppid, []).append(pid)
            self._table, self._children, self._at = table, children, now
        return self._children

    def tree(self, root: int) -> TreeUsage:
        """What the live processes of `root`'s tree hold now (zombies hold no memory and run nothing)."""
        children = self.snapshot()
        pids, todo = [], [root]
        while todo:
            pid = todo.pop()
            if pid in self._table:
                pids.append(pid)
                todo.extend(children.get(pid, ()))
        live = [p for p in pids if not self._table[p].zombie]
        return TreeUsage(tuple(pids), sum(self._table[p].tasks for p in live),
                         sum(resident_bytes(p) for p in live), sum(self._table[p].cpu_s for p in pids))
