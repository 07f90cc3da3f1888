"""A child process driven from the event loop, started with subprocess.Popen rather than the loop's own
subprocess support.

Why: uvloop (the loop the servers run on) starts a child with a plain fork(), whose cost grows with the
parent's memory map, and does it on the loop's thread; the server imports torch (through `rewards`), so
each start blocked the loop for ~45 ms here, while Popen's vfork took ~1.5 ms. The pipes are then
attached to the loop as streams, and the exit is awaited through a pidfd (a poll of the child on
kernels before 5.3, which lack it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess


class ChildProcess:
    """`argv` started in its own session with piped stdin and stdout (and stderr, or stderr into stdout),
    inheriting `pass_fds` and no other descriptor."""

    def __init__(self, argv: list[str], env: dict[str, str], merge_stderr: bool,
                 pass_fds: tuple[int, ...] = ()) -> None:
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, env=env,
                                      cwd="/", start_new_session=True, pass_fds=pass_fds)
        self.pid = self.popen.pid
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._readers: list[asyncio.BaseTransport] = []

    async def attach(self) -> "ChildProcess":
        """Hand the pipes to the running loop (they close with their transports, in close())."""
        loop = asyncio.get_running_loop()
        self.stdout = await self._reader(loop, self.popen.stdout)
        if self.popen.stderr is not None:
            self.stderr = await self._reader(loop, self.popen.stderr)
        self._stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, self.popen.stdin)
        return self

    async def _reader(self, loop: asyncio.AbstractEventLoop, pipe) -> asyncio.StreamReader:  # noqa: ANN001
        reader = asyncio.StreamReader(limit=1 << 16)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        self._readers.append(transport)
        return reader

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def write_stdin(self, data: bytes) -> None:
        """Queue `data` and close stdin after it; a child that stops reading just loses the rest (the
        transport drops its buffer when the pipe breaks)."""
        assert self._stdin is not None, "attach() first"
        if not self._stdin.is_closing():
            self._stdin.write(data)
            self._stdin.close()

    def kill(self) -> None:
        """SIGKILL the child's whole session (the child leads it)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def wait(self) -> int:
        if self.popen.returncode is not None:
            return self.popen.returncode
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (kernel < 5.3, or already reaped): poll
            while self.popen.poll() is None:
                await asyncio.sleep(0.005)
            return self.popen.returncode
        exited = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return self.popen.wait()

    def close(self) -> None:
        """Close the pipes' transports (after the child ended; what was not read is dropped)."""
        for transport in [*self._readers, self._stdin]:
            if transport is not None and not transport.is_closing():
                transport.abort() if isinstance(transport, asyncio.WriteTransport) else transport.close()
