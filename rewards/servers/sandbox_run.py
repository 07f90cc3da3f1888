"""One sandboxed call: start the sandbox, feed it the call, read at most `output_bytes` of its output,
and kill its whole process tree at the deadline, at the output cap, or when it ends.

The kill is SIGKILL to the sandbox's outer process (bwrap or unshare, in its own session): bwrap's
--die-with-parent and unshare's --kill-child then kill the pid namespace's init, and the kernel kills
every other process in the namespace with it, daemons included. Ending is the same: the namespace's
init exits when the code's main process does. A timeout, a kill or a nonzero exit is a result, never
an exception.
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

from pydantic import BaseModel, ConfigDict, Field

from rewards.servers.sandbox_isolation import CLEAN_ENV, SANDBOX_CWD, Isolation
from rewards.servers.sandbox_proc import ChildProcess


class SandboxLimits(BaseModel):
    """Per-call limits; a call may ask for a shorter wall time or less memory, never for more of anything.
    /tmp's and /dev/shm's sizes are set when a sandbox starts (a warm one included), the rest by the call."""

    model_config = ConfigDict(extra="forbid")
    wall_s: float = Field(10.0, gt=0, le=600, description="wall-clock seconds before the call is killed")
    cpu_s: int = Field(10, ge=1, le=600, description="CPU seconds (RLIMIT_CPU) of each process in the sandbox")
    memory_mb: int = Field(1024, ge=64, le=1 << 20, description="address space (RLIMIT_AS) of each process, MiB")
    processes: int = Field(64, ge=1, le=4096, description="processes and threads (RLIMIT_NPROC) in the sandbox")
    output_bytes: int = Field(65536, ge=1024, le=64 << 20,
                              description="stdout+stderr bytes kept; more kills the call")
    tmp_mb: int = Field(64, ge=1, le=1 << 14, description="size of the writable tmpfs at /tmp, MiB")
    shm_mb: int = Field(16, ge=1, le=1 << 14, description="size of the writable tmpfs at /dev/shm (POSIX shared "
                                                         "memory: multiprocessing's semaphores), MiB")
    open_files: int = Field(256, ge=16, le=65536, description="open file descriptors (RLIMIT_NOFILE)")

    def boot_limits(self) -> dict[str, int]:
        return {"cpu_s": self.cpu_s, "memory_bytes": self.memory_mb << 20, "processes": self.processes,
                "file_bytes": self.tmp_mb << 20, "open_files": self.open_files}


@dataclass(frozen=True)
class RunResult:
    """What a call did. `exit_code` is None when the call was killed (timeout or output cap)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout
    seconds: float
    timed_out: bool = False
    output_overflow: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_overflow

    def describe_failure(self, limits: SandboxLimits, wall_s: float) -> str:
        """'' for a clean exit; else one readable line: 'timeout after 5.0 s', 'exit status 1', ..."""
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


async def start_sandbox(isolation: Isolation, limits: SandboxLimits, merge_stderr: bool) -> ChildProcess:
    """A fresh sandbox, started up to the point where it waits for its call on stdin."""
    with isolation.launch(limits.tmp_mb << 20, limits.shm_mb << 20) as (argv, fds):
        proc = ChildProcess(argv, dict(CLEAN_ENV), merge_stderr, fds)
    return await proc.attach()


async def run_sandboxed(isolation: Isolation, mode: Literal["python", "shell"], code: str, limits: SandboxLimits,
                        *, wall_s: float | None = None, stdin: bytes = b"", files: dict[str, bytes] | None = None,
                        merge_stderr: bool = True, started: ChildProcess | None = None,
                        memory_mb: int | None = None) -> RunResult:
    """Run `code` (Python source, or a /bin/sh command) in a fresh sandbox (`started`: one started ahead
    with the same isolation, limits and merge_stderr, never used before); `files` maps names relative to
    the working directory to contents written before the code starts. `wall_s` and `memory_mb` lower
    the limits' own for this call; a value above them is cut to them."""
    wall_s = min(wall_s or limits.wall_s, limits.wall_s)
    if memory_mb is not None and memory_mb < 1:
        raise ValueError(f"memory_mb must be a positive number of MiB, not {memory_mb}")
    call_limits = limits.model_copy(update={"memory_mb": min(memory_mb or limits.memory_mb, limits.memory_mb)})
    host_dir = tempfile.mkdtemp(prefix="agentrl-sandbox-") if isolation.name == "none" else None
    if host_dir and isolation.uid:
        os.chown(host_dir, isolation.uid, isolation.uid)
    t0 = time.perf_counter()
    proc = started or await start_sandbox(isolation, limits, merge_stderr)
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
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        proc.close()
        if host_dir:
            proc.kill()  # no pid namespace: whatever the code left in its session goes with it
            shutil.rmtree(host_dir, ignore_errors=True)
    killed = timed_out or overflow
    return RunResult(None if killed else proc.returncode, bytes(sinks[0]), bytes(sinks[1]) if len(sinks) > 1 else b"",
                     time.perf_counter() - t0, timed_out, overflow)
