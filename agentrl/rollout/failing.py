"""The futures a run's parts fail through: a fleet whose engines cannot be restarted, a pool whose
episodes keep failing, a producer whose every group is dropped. The run awaits its work with
`unless_failed(work, *futures)`, so the first such failure ends the wait with its error instead of
the run waiting for a batch that will never come."""

from __future__ import annotations

import asyncio


class FailOnce:
    """The future a component fails through, which `unless_failed` awaits beside the run's work:
    made on first use (on the running loop, not at construction), and set with the first failure only."""

    def __init__(self) -> None:
        self._future: asyncio.Future | None = None

    @property
    def future(self) -> asyncio.Future:
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
        return self._future

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # read once: asyncio must not log it as never retrieved when no one waits


async def unless_failed(coro, *failed: asyncio.Future):
    """Await `coro`, unless one of the `failed` futures (a fleet's, a pool's) gets an exception
    first: then raise it, cancelling `coro`."""
    task = asyncio.ensure_future(coro)
    await asyncio.wait([task, *failed], return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise next(f for f in failed if f.done()).exception()
    return task.result()
