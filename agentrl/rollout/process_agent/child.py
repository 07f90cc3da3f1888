"""One agent process: started in a process group of its own, its output's tails kept, the whole group
killed when it is done, and its exit turned into an error that says what happened.

The group kill is SIGKILL to -pgid in `finally`, so it also runs when the episode's deadline cancels the
wait: whatever the program started (a shell, a language server, a grandchild that ignores SIGTERM) dies
with it. A descendant that left the group on its own (setsid, or a daemon's double fork) is out of reach
of a group kill; the sandbox (process_agent.sandbox) is what holds those, in a pid namespace that dies
with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable

from agentrl.rollout.process_agent.fds import read_tail, wait_exit, write_all

# After the process exits and its group is killed, its pipes close at once; a writer that left the
# group can hold them open, and the episode does not wait on it longer than this.
DRAIN_S = 1.0


class ProcessAgentError(RuntimeError):
    """The agent process did not end as a program that played its episode: the message says how."""


class ProcessOutput(Exception):
    """The tails of the process's output, chained under a ProcessAgentError so that they land in the
    episode's traceback (agentrl.utils.tracebacks.describe) and not in its one-line error."""


@dataclass
class ChildResult:
    """How one agent process ended, with the times the overhead benchmark reads (time.monotonic)."""

    returncode: int  # < 0: killed by that signal (asyncio's convention)
    stdout_tail: bytes
    stderr_tail: bytes
    spawned_at: float  # just before the exec
    started_at: float  # when the exec call returned (in a thread: the loop runs on meanwhile)
    exited_at: float  # when its exit was seen

    def output(self) -> ProcessOutput:
        def text(tail: bytes) -> str:
            return tail.decode(errors="replace").rstrip() or "(nothing)"
        return ProcessOutput(f"the agent process's stderr (its last {len(self.stderr_tail)} bytes):\n"
                             f"{text(self.stderr_tail)}\nits stdout (last {len(self.stdout_tail)} bytes):\n"
                             f"{text(self.stdout_tail)}")


def last_line(tail: bytes) -> str:
    lines = tail.decode(errors="replace").strip().splitlines()
    return lines[-1].strip()[:300] if lines else ""


def exit_error(result: ChildResult, signal_offset: int = 0) -> ProcessAgentError | None:
    """None for exit code 0; else the error that names the code or signal and stderr's last line.
    `signal_offset` 128: a launcher (bubblewrap) that reports its child's signal as 128 + its number."""
    code = result.returncode
    signum = -code if code < 0 else code - signal_offset if signal_offset and signal_offset < code < signal_offset + 65 else 0
    if code == 0:
        return None
    line = last_line(result.stderr_tail)
    if signum:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        what = f"the agent process was killed by {name}"
    else:
        what = f"the agent process exited with code {code}"
    return ProcessAgentError(f"{what}: {line}" if line else f"{what} (nothing on stderr)")


def kill_group(pgid: int) -> None:
    """SIGKILL to every process left in the group; none left is fine. A group's id stays taken while any
    member lives, so it names no stranger's group unless all of it is gone and the pid came round again."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_spawned(spawn: asyncio.Future) -> None:
    if not spawn.cancelled() and spawn.exception() is None:
        proc = spawn.result()
        kill_group(proc.pid)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        asyncio.ensure_future(wait_exit(proc))  # reaped


async def _close_after(work: Awaitable[None], pipe: Any) -> None:
    try:
        await work
    finally:
        pipe.close()


async def run_child(argv: list[str], env: dict[str, str], cwd: Path, stdin_data: bytes | None,
                    output_bytes: int) -> ChildResult:
    """Runs `argv` to its exit; the caller's deadline cancels the wait. Its group is dead when this
    returns or raises. OSError when it cannot start (the file is not there, not executable)."""
    spawned_at = time.monotonic()
    # Popen (vfork), not the loop's own spawn (a fork of the whole trainer): process_agent.fds says why.
    # In a thread: Popen returns only once the child has exec'd, 10-30 ms on a loaded machine.
    spawn = asyncio.ensure_future(asyncio.to_thread(
        subprocess.Popen, argv, cwd=cwd, env=env, start_new_session=True, bufsize=0, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL))
    try:
        proc = await asyncio.shield(spawn)
    except asyncio.CancelledError:  # the deadline came mid-spawn: the process starts anyway, and dies at once
        spawn.add_done_callback(_kill_spawned)
        raise
    started_at = time.monotonic()
    out, err = bytearray(), bytearray()
    tasks = [asyncio.ensure_future(_close_after(read_tail(proc.stdout.fileno(), out, output_bytes), proc.stdout)),
             asyncio.ensure_future(_close_after(read_tail(proc.stderr.fileno(), err, output_bytes), proc.stderr))]
    if stdin_data is not None:
        tasks.append(asyncio.ensure_future(_close_after(write_all(proc.stdin.fileno(), stdin_data), proc.stdin)))
    try:
        returncode = await wait_exit(proc)
        exited_at = time.monotonic()
    finally:
        kill_group(proc.pid)  # start_new_session: its pid is its group's id
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        if proc.returncode is None:  # the wait was cancelled: reap the SIGKILLed leader before returning
            try:
                await asyncio.wait_for(wait_exit(proc), DRAIN_S)
            except TimeoutError:
                pass
    return ChildResult(returncode, bytes(out), bytes(err), spawned_at, started_at, exited_at)
