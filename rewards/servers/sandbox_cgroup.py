"""Cgroups for the sandbox server: one per sandbox, under one for the server, each a bound on memory,
processes (tasks) and CPU for everything inside it, whatever it forks.

Where: under the server's own cgroup (as /proc/self/cgroup names it), so the sandboxes stay inside
whatever bounds the server itself is under; `agentrl-sandbox-<server pid>/call-<n>`. cgroup v2 when the
server's cgroup offers the memory and pids controllers (cpu too where it has it), else cgroup v1's
memory, pids and cpu hierarchies where all can be written; else `find` says why not, and the server
falls back to the watchdog (sandbox_watch.py).

A sandbox enters its cgroup before it runs anything: its command line starts with `/bin/sh -c 'echo $$ >
cgroup.procs ... exec "$@"'` (one exec of dash, ~1 ms), so every process it forks starts inside. The
limits are set before the sandbox starts; a kernel that takes the writes but does not enforce them (a
gVisor-like one) is caught by `probe`, which runs a process over a small memory and task limit and
expects it refused and killed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


class NoCgroup(RuntimeError):
    """No writable cgroup here; the message says what was tried."""


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _counter(path: Path, key: str) -> int:
    """`key N` from a flat keyed file (memory.events, memory.oom_control, pids.events); 0 when absent."""
    with contextlib.suppress(OSError):
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


@dataclass(frozen=True)
class Hierarchy:
    """Where one cgroup's files are: v2 is one folder for all controllers; v1 one folder per controller."""

    version: Literal[1, 2]
    folders: dict[str, Path]  # controller -> folder (v2: every controller -> the same folder)

    def child(self, name: str) -> "Hierarchy":
        return Hierarchy(self.version, {c: f / name for c, f in self.folders.items()})

    @property
    def roots(self) -> list[Path]:
        return list(dict.fromkeys(self.folders.values()))


def _own_folders() -> tuple[Hierarchy | None, Hierarchy | None, list[str]]:
    """The server's own cgroup as a v2 Hierarchy and as a v1 one (each None when not mounted), and why not."""
    own: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            own[name] = path
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        fields = line.split()
        root, mountpoint = fields[3], fields[4]
        fstype, options = fields[fields.index("-") + 1], fields[-1].split(",")
        if fstype == "cgroup2" and "" in own and own[""].startswith(root):
            v2 = Path(mountpoint) / os.path.relpath(own[""], root)
        elif fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options and own.get(controller, "\0").startswith(root):
                    v1[controller] = Path(mountpoint) / os.path.relpath(own[controller], root)
    why = []
    two = None
    if v2 is not None:
        offered = set(_read(v2 / "cgroup.controllers").split())
        if {"memory", "pids"} <= offered:
            two = Hierarchy(2, {c: v2 for c in CONTROLLERS if c in offered})
        else:
            why.append(f"cgroup v2 at {v2} offers {sorted(offered) or 'no controllers'}, not memory and pids")
    one = None
    if {"memory", "pids"} <= set(v1):
        one = Hierarchy(1, v1)
    elif v1 or v2 is None:
        why.append(f"cgroup v1 mounts only {sorted(v1) or 'none'} of memory, pids")
    return two, one, why


def _enable_v2(own: Path, controllers: list[str]) -> None:
    """Let `own`'s children use `controllers`. cgroup v2 allows that only in a cgroup without processes of its
    own (the root excepted): when the server sits there alone, it moves to a leaf of its own first."""
    wanted = " ".join("+" + c for c in controllers)
    try:
        _write(own / "cgroup.subtree_control", wanted)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        leaf = own / f"agentrl-sandbox-server-{os.getpid()}"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        _write(own / "cgroup.subtree_control", wanted)


def _remove_stale(folder: Path) -> None:
    """Empty `agentrl-sandbox-<pid>` cgroups a killed server left (its pid gone)."""
    with contextlib.suppress(OSError):
        for entry in folder.glob("agentrl-sandbox-[0-9]*"):
            pid = entry.name.rsplit("-", 1)[1]
            if not Path(f"/proc/{pid}").exists():
                for child in entry.glob("call-*"):
                    with contextlib.suppress(OSError):
                        child.rmdir()
                with contextlib.suppress(OSError):
                    entry.rmdir()


def find() -> Hierarchy:
    """A cgroup for the server's sandboxes under its own (made here), v2 first; NoCgroup saying why when none
    can be made and written."""
    two, one, why = _own_folders()
    for candidate in (two, one):
        if candidate is None:
            continue
        mine = candidate.child(f"agentrl-sandbox-{os.getpid()}")
        try:
            for root in candidate.roots:
                _remove_stale(root)
            if candidate.version == 2:
                _enable_v2(candidate.roots[0], list(candidate.folders))
            for folder in mine.roots:
                folder.mkdir(exist_ok=True)
            if candidate.version == 2:
                _write(mine.roots[0] / "cgroup.subtree_control", " ".join("+" + c for c in mine.folders))
            return mine
        except OSError as exc:
            why.append(f"cgroup v{candidate.version} under {candidate.roots[0].parent}: {exc.strerror or exc}")
            remove(mine)
    raise NoCgroup("; ".join(why) or "no cgroup mounted")


def remove(cgroup: Hierarchy) -> bool:
    """rmdir each folder (a cgroup with no processes left); False while one is still busy."""
    done = True
    for folder in cgroup.roots:
        try:
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            done = False
    return done


@dataclass(frozen=True)
class Limits:
    """What one cgroup may use: bytes of memory (swap none), tasks (processes and threads), CPUs (None: any)."""

    memory_bytes: int
    tasks: int
    cpus: float | None = None


def set_limits(cgroup: Hierarchy, limits: Limits) -> None:
    memory, pids = cgroup.folders["memory"], cgroup.folders["pids"]
    cpu = cgroup.folders.get("cpu")
    if cgroup.version == 2:
        _write(memory / "memory.max", str(limits.memory_bytes))
        with contextlib.suppress(OSError):  # no swap accounting: nothing to swap to either
            _write(memory / "memory.swap.max", "0")
        _write(memory / "memory.oom.group", "1")  # an OOM kills the whole sandbox, as a wall timeout does
        _write(pids / "pids.max", str(limits.tasks))
        if cpu is not None:
            _write(cpu / "cpu.max", f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}" if limits.cpus else "max")
        return
    set_memory(cgroup, limits.memory_bytes)
    _write(pids / "pids.max", str(limits.tasks))
    if cpu is not None:
        _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(int(limits.cpus * CPU_PERIOD_US)) if limits.cpus else "-1")


def set_memory(cgroup: Hierarchy, memory_bytes: int) -> None:
    """Only the memory limit: the server's own cgroup, or a call's own (lower) bound on a sandbox started
    with the server's."""
    memory = cgroup.folders["memory"]
    if cgroup.version == 2:
        _write(memory / "memory.max", str(memory_bytes))
        return
    # v1 with swap accounting: memory plus swap gets the same bound; the kernel keeps memsw >= memory, so
    # memsw goes second when lowering and first when raising
    memsw = memory / "memory.memsw.limit_in_bytes"
    try:
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
    except OSError:
        if not memsw.exists():
            raise
        _write(memsw, str(memory_bytes))
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
    if memsw.exists():
        with contextlib.suppress(OSError):
            _write(memsw, str(memory_bytes))


def oom_kills(cgroup: Hierarchy) -> int:
    memory = cgroup.folders["memory"]
    return _counter(memory / ("memory.events" if cgroup.version == 2 else "memory.oom_control"), "oom_kill")


def refused_forks(cgroup: Hierarchy) -> int:
    return _counter(cgroup.folders["pids"] / "pids.events", "max")


def peak_bytes(cgroup: Hierarchy) -> int | None:
    """The most memory the cgroup held at once (None where the kernel keeps no peak: v2 before 5.19)."""
    memory = cgroup.folders["memory"]
    with contextlib.suppress(OSError, ValueError):
        return int(_read(memory / ("memory.peak" if cgroup.version == 2 else "memory.max_usage_in_bytes")))
    return None


def kill_all(cgroup: Hierarchy) -> None:
    """SIGKILL every process in the cgroup (v2: cgroup.kill, where the kernel has it)."""
    folder = cgroup.folders["pids"]
    if cgroup.version == 2:
        with contextlib.suppress(OSError):
            _write(folder / "cgroup.kill", "1")
            return
    with contextlib.suppress(OSError):
        for pid in _read(folder / "cgroup.procs").split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def enter_argv(cgroup: Hierarchy, argv: list[str]) -> list[str]:
    """`argv` run from inside `cgroup`: the shell writes its own pid into each cgroup.procs, then execs it."""
    procs = [str(folder / "cgroup.procs") for folder in cgroup.roots]
    script = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(procs))) + f' && shift {len(procs)} && exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *procs, *argv]


PROBE_CODE = """
import os, time
forked = refused = 0
for _ in range(8):
    try:
        if os.fork() == 0:
            time.sleep(0.5)
            os._exit(0)
        forked += 1
    except OSError:
        refused += 1
print(forked, refused, flush=True)
x = b"x" * (96 << 20)
print("alive", flush=True)
"""


def probe(cgroup: Hierarchy, python: str) -> str:
    """'' when a child cgroup's limits are enforced here: a process given 4 tasks and 48 MiB has its forks
    refused and is killed when it fills 96 MiB; else what happened instead."""
    test = cgroup.child(f"probe-{os.getpid()}")
    try:
        for folder in test.roots:
            folder.mkdir(exist_ok=True)
        set_limits(test, Limits(48 << 20, 4))
        done = subprocess.run(enter_argv(test, [python, "-I", "-c", PROBE_CODE]), capture_output=True, timeout=30)
        out = done.stdout.decode(errors="replace").split()
        if done.returncode == 0 or "alive" in out:
            return f"a process filled 96 MiB under a 48 MiB limit (exit status {done.returncode})"
        if len(out) < 2 or out[1] == "0":
            return f"forks were not refused at 4 tasks (printed {' '.join(out)!r}, exit status {done.returncode})"
        if not oom_kills(test):
            return f"the kernel counted no OOM kill (exit status {done.returncode})"
        return ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe: {exc}"
    finally:
        kill_all(test)
        for _ in range(100):
            if remove(test):
                break
            time.sleep(0.01)
