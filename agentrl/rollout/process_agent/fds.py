"""A child process's pipes and exit, awaited through the event loop's readiness callbacks on raw file
descriptors (a pidfd for the exit), so the process can be started with `subprocess.Popen`.

Why not `asyncio.create_subprocess_exec`: on uvloop (the loop train.py runs) it forks the whole trainer
on the event loop, which costs in proportion to the trainer's memory: 62 ms per spawn at 1.5 GB RSS,
5 ms at 100 MB (measured here, /bin/true), every episode, with every other episode waiting. CPython's
Popen uses vfork and costs 0.16 ms at either size (process_agent.child calls it in a thread: it returns
only once the child has exec'd, which on a loaded machine is tens of ms). Works on uvloop and on asyncio's own loop; a child
this reaps is one neither loop watches (each waits only for the pids it spawned itself).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Callable

CHUNK = 1 << 16
POLL_S = 0.005  # the exit's poll interval where there is no pidfd (Linux before 5.3)


async def _ready(add: Callable, remove: Callable, fd: int) -> None:
    """Until `fd` is readable (add=loop.add_reader) or writable (add=loop.add_writer)."""
    future = asyncio.get_running_loop().create_future()
    add(fd, lambda: future.done() or future.set_result(None))
    try:
        await future
    finally:
        remove(fd)


async def read_tail(fd: int, tail: bytearray, limit: int) -> None:
    """Reads `fd` to EOF keeping its last `limit` bytes in `tail`."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            await _ready(loop.add_reader, loop.remove_reader, fd)
            continue
        if not chunk:
            return
        tail += chunk
        if len(tail) > limit:
            del tail[:len(tail) - limit]


async def write_all(fd: int, data: bytes) -> None:
    """Writes `data` to `fd`; a reader that is gone (the program never read its stdin) is not an error."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                await _ready(loop.add_writer, loop.remove_writer, fd)
    except (BrokenPipeError, ConnectionResetError):
        pass


async def wait_exit(proc: subprocess.Popen) -> int:
    """The process's exit status once it exits (reaped here); < 0 for a signal, as Popen has it."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        while proc.poll() is None:
            await asyncio.sleep(POLL_S)
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        while proc.poll() is None:
            await _ready(loop.add_reader, loop.remove_reader, pidfd)
    finally:
        os.close(pidfd)
    return proc.returncode
