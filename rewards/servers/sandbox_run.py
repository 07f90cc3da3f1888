"""One sandboxed call: start the sandbox, feed it the call, read at most `output_bytes` of its output,
and kill its whole process tree at the deadline, at the output cap, or when it ends.

The kill is SIGKILL to the sandbox's outer process (bwrap or unshare, in its own session): bwrap's
--die-with-parent and unshare's --kill-child then kill the pid namespace's init, and the kernel kills
every other process in the namespace with it, daemons included. Ending is the same: the namespace's
init exits when the code's main process does. A timeout, a kill or a nonzero exit is a result, never
an exception; so is a call over its bound as a whole (sandbox_bound.py), checked every tick while it runs
and once when it ended.
"""

from __future__ import annotations

import asyncio
import marshal
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rewards.servers.sandbox_bound import NPROC_SLACK, Bounds, CallBound, CallTotals, LimitHit
from rewards.servers.sandbox_isolation import CLEAN_ENV, SANDBOX_CWD, Isolation
from rewards.servers.sandbox_proc import ChildProcess

CALL_MEMORY_FLOOR_MB = 64  # a call's own memory besides /tmp and /dev/shm, however low it asks


class SandboxLimits(BaseModel):
    """Per-call limits; a call may ask for a shorter wall time or less memory, never for more of anything.
    /tmp's and /dev/shm's sizes are set when a sandbox starts (a warm one included), the rest by the call."""

    model_config = ConfigDict(extra="forbid")
    wall_s: float = Field(10.0, gt=0, le=600, description="wall-clock seconds before the call is killed")
    cpu_s: int = Field(10, ge=1, le=600, description="CPU seconds (RLIMIT_CPU) of each process in the sandbox")
    memory_mb: int = Field(1024, ge=64, le=1 << 20, description="address space (RLIMIT_AS) of each process, MiB")
    call_memory_mb: int = Field(1024, ge=64, le=1 << 20,
                                description="memory of the call's processes in all, /tmp and /dev/shm included, "
                                            "MiB (a cgroup's memory limit, else the watchdog's)")
    processes: int = Field(64, ge=1, le=4096, description="processes and threads the call's code runs in all "
                                                        "(a cgroup's pids.max, else the watchdog's; RLIMIT_NPROC)")
    call_cpus: float = Field(2.0, gt=0, le=1024, description="CPUs the call's processes use in all (a cgroup's CPU "
                                                             "quota; the watchdog: CPU seconds over this x wall_s)")
    output_bytes: int = Field(65536, ge=1024, le=64 << 20,
                              description="stdout+stderr bytes kept; more kills the call")
    tmp_mb: int = Field(64, ge=1, le=1 << 14, description="size of the writable tmpfs at /tmp, MiB")
    shm_mb: int = Field(16, ge=1, le=1 << 14, description="size of the writable tmpfs at /dev/shm (POSIX shared "
                                                         "memory: multiprocessing's semaphores), MiB")
    open_files: int = Field(256, ge=16, le=65536, description="open file descriptors (RLIMIT_NOFILE)")

    @model_validator(mode="after")
    def _tmpfs_fit_the_call(self) -> "SandboxLimits":
        if self.call_memory_mb < self.tmp_mb + self.shm_mb + CALL_MEMORY_FLOOR_MB:
            raise ValueError(f"call_memory_mb {self.call_memory_mb} must hold tmp_mb + shm_mb + "
                             f"{CALL_MEMORY_FLOOR_MB} ({self.tmp_mb + self.shm_mb + CALL_MEMORY_FLOOR_MB}): the "
                             "call's /tmp and /dev/shm are in its memory")
        return self

    def boot_limits(self) -> dict[str, int]:
        # RLIMIT_NPROC a few past the bound: the cgroup (or the watchdog) sees the call go over and ends it
        return {"cpu_s": self.cpu_s, "memory_bytes": self.memory_mb << 20, "processes": self.processes + NPROC_SLACK,
                "file_bytes": self.tmp_mb << 20, "open_files": self.open_files}

    def lowered(self, wall_s: float | None = None, memory_mb: int | None = None) -> "SandboxLimits":
        """These limits with a call's own wall time and memory (a value above the limits' is cut to them;
        `memory_mb` lowers each process's address space and the call's total, which keeps room for the
        call's /tmp and /dev/shm)."""
        if memory_mb is not None and memory_mb < 1:
            raise ValueError(f"memory_mb must be a positive number of MiB, not {memory_mb}")
        call_memory_mb = self.call_memory_mb
        if memory_mb is not None:
            floor = self.tmp_mb + self.shm_mb + CALL_MEMORY_FLOOR_MB
            call_memory_mb = max(min(memory_mb, call_memory_mb), min(floor, call_memory_mb))
        return self.model_copy(update={"wall_s": min(wall_s or self.wall_s, self.wall_s),
                                       "memory_mb": min(memory_mb or self.memory_mb, self.memory_mb),
                                       "call_memory_mb": call_memory_mb})

    def totals(self) -> CallTotals:
        return CallTotals(self.call_memory_mb << 20, (self.tmp_mb + self.shm_mb) << 20, self.processes,
                          self.call_cpus, self.wall_s)


@dataclass(frozen=True)
class RunResult:
    """What a call did. `exit_code` is None when the call was killed (timeout, output cap or its bound as a
    whole: `limit`); `peak_bytes`, the most memory its processes held at once as its bound saw it (a
    cgroup's peak, else the watchdog's highest sample; None when unknown)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout
    seconds: float
    timed_out: bool = False
    output_overflow: bool = False
    limit: LimitHit | None = None
    peak_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_overflow and self.limit is None

    def describe_failure(self, limits: SandboxLimits, wall_s: float) -> str:
        """'' for a clean exit; else one readable line: 'timeout after 5.0 s', 'exit status 1', 'memory limit:
        ...', ..."""
        if self.limit is not None:  # first: a wall timeout or a kill is what the bound did
            return self.limit.text
        if self.timed_out:
            return f"timeout after {wall_s:.1f} s"
        if self.output_overflow:
            return f"output over {limits.output_bytes} bytes: truncated and killed"
        if self.exit_code == 0:
            return ""
        code = self.exit_code if self.exit_code is not None else -1
        signum = -code if code < 0 else code - 128 if 128 < code < 160 else 0  # unshare: -sig, bwrap: 128+sig
        if not signum:
            return f"exit status {code}"
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
        why = {"SIGXCPU": f": CPU time limit of {limits.cpu_s} s", "SIGKILL": ": killed",
               "SIGXFSZ": f": file size limit of {limits.tmp_mb} MiB"}.get(name, "")
        return f"exit status {code} ({name}{why})"


def _header(mode: str, code: str, files: dict[str, bytes], cwd: str, limits: SandboxLimits) -> bytes:
    """What sandbox_boot.py reads first; marshal (of str, bytes, int and dict only): builtin in every python."""
    header = marshal.dumps({"mode": mode, "code": code, "files": files, "cwd": cwd, "limits": limits.boot_limits()})
    return b"%d\n" % len(header) + header


async def _drain(streams: list[asyncio.StreamReader], sinks: list[bytearray], cap: int) -> bool:
    """Read every stream to its end into its sink, keeping at most `cap` bytes in all (what was read stays
    when the caller's deadline cancels this); True as soon as more came."""
    total = 0
    pending = {asyncio.ensure_future(s.read(65536)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                chunk = task.result()
                if not chunk:
                    continue
                sinks[i] += chunk[: max(0, cap - total)]
                total += len(chunk)
                if total > cap:
                    return True
                pending[asyncio.ensure_future(streams[i].read(65536))] = i
        return False
    finally:
        for task in pending:
            task.cancel()


@dataclass(frozen=True)
class Sandbox:
    """A started sandbox and what bounds it as a whole."""

    proc: ChildProcess
    bound: CallBound


async def start_sandbox(isolation: Isolation, limits: SandboxLimits, merge_stderr: bool, bounds: Bounds) -> Sandbox:
    """A fresh sandbox inside its bound, started up to the point where it waits for its call on stdin."""
    bound = bounds.new_call(limits.totals(), isolation.launcher_tasks)
    try:
        with isolation.launch(limits.tmp_mb << 20, limits.shm_mb << 20) as (argv, fds):
            proc = ChildProcess(bound.wrap(argv), dict(CLEAN_ENV), merge_stderr, fds)
    except BaseException:
        bound.close()
        raise
    bound.attach(proc.pid)
    return Sandbox(await proc.attach(), bound)


async def _watch(sandbox: Sandbox) -> LimitHit:
    """Every tick: the call's bound as a whole; over it, the whole sandbox is killed."""
    while (hit := sandbox.bound.check()) is None:
        await asyncio.sleep(sandbox.bound.tick_s)
    sandbox.bound.kill()
    sandbox.proc.kill()
    return hit


async def run_sandboxed(isolation: Isolation, mode: Literal["python", "shell"], code: str, limits: SandboxLimits,
                        bounds: Bounds, *, wall_s: float | None = None, stdin: bytes = b"",
                        files: dict[str, bytes] | None = None, merge_stderr: bool = True,
                        started: Sandbox | None = None, memory_mb: int | None = None) -> RunResult:
    """Run `code` (Python source, or a /bin/sh command) in a fresh sandbox (`started`: one started ahead
    with the same isolation, limits, bounds and merge_stderr, never used before); `files` maps names
    relative to the working directory to contents written before the code starts. `wall_s` and `memory_mb`
    lower the limits' own for this call (SandboxLimits.lowered); a value above them is cut to them."""
    call_limits = limits.lowered(wall_s, memory_mb)
    wall_s = call_limits.wall_s
    host_dir = tempfile.mkdtemp(prefix="agentrl-sandbox-") if isolation.name == "none" else None
    if host_dir and isolation.uid:
        os.chown(host_dir, isolation.uid, isolation.uid)
    t0 = time.perf_counter()
    sandbox = started or await start_sandbox(isolation, limits, merge_stderr, bounds)
    proc = sandbox.proc
    try:
        sandbox.bound.set_totals(call_limits.totals())
    except OSError:  # its usage is over the call's own lower bound already: a fresh one at that bound
        sandbox.bound.kill()
        proc.kill()
        await proc.wait()
        proc.close()
        sandbox.bound.close()
        sandbox = await start_sandbox(isolation, call_limits, merge_stderr, bounds)
        proc = sandbox.proc
    watch = asyncio.ensure_future(_watch(sandbox))
    proc.write_stdin(_header(mode, code, files or {}, host_dir or SANDBOX_CWD, call_limits) + stdin)
    streams = [proc.stdout] if merge_stderr else [proc.stdout, proc.stderr]
    timed_out = overflow = False
    sinks = [bytearray() for _ in streams]
    try:
        async with asyncio.timeout(wall_s):
            overflow = await _drain(streams, sinks, limits.output_bytes)  # type: ignore[arg-type]
            if not overflow:
                await proc.wait()
    except TimeoutError:
        timed_out = True
    finally:
        watch.cancel()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        proc.close()
        if host_dir:
            proc.kill()  # no pid namespace: whatever the code left in its session goes with it
            shutil.rmtree(host_dir, ignore_errors=True)
        # a limit the last tick did not see (a child OOM-killed just before the call ended) counts too
        hit = watch.result() if watch.done() and not watch.cancelled() else sandbox.bound.check()
        peak = sandbox.bound.peak_bytes()
        sandbox.bound.close()
    killed = timed_out or overflow or hit is not None
    return RunResult(None if killed else proc.returncode, bytes(sinks[0]), bytes(sinks[1]) if len(sinks) > 1 else b"",
                     time.perf_counter() - t0, timed_out and hit is None, overflow and hit is None, hit, peak)
