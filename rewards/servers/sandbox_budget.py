"""The sandbox server's memory across concurrent calls: a call runs only once its own bound as a whole
(SandboxLimits.call_memory_mb, or lower) fits what the running calls leave of the server's total; else
it waits its turn, first come first served (a small call never jumps a big one that waits: no big call
waits forever). With every running call inside its own bound, the calls together stay inside the total.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import AsyncIterator


class MemoryBudget:
    """`total_mb` shared by the calls that hold part of it (`hold`)."""

    def __init__(self, total_mb: int) -> None:
        self.total_mb = total_mb
        self.held_mb = 0
        self.max_held_mb = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    @contextlib.asynccontextmanager
    async def hold(self, mb: int) -> AsyncIterator[None]:
        """Hold `mb` for the block, once it fits behind every call that came first."""
        if mb > self.total_mb:
            raise ValueError(f"a call's {mb} MiB can never fit the server's {self.total_mb} MiB")
        if self._waiting or self.held_mb + mb > self.total_mb:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append((mb, turn))
            try:
                await turn
            except BaseException:
                if turn.done() and not turn.cancelled():  # admitted just as it was cancelled: give it back
                    self._release(mb)
                else:
                    self._waiting.remove((mb, turn))
                    self._admit()
                raise
        else:
            self._take(mb)
        try:
            yield
        finally:
            self._release(mb)

    def _take(self, mb: int) -> None:
        self.held_mb += mb
        self.max_held_mb = max(self.max_held_mb, self.held_mb)

    def _release(self, mb: int) -> None:
        self.held_mb -= mb
        self._admit()

    def _admit(self) -> None:
        while self._waiting and self.held_mb + self._waiting[0][0] <= self.total_mb:
            mb, turn = self._waiting.popleft()
            self._take(mb)
            turn.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)
