"""One engine's side of a collective push, as the fleet drives it: join the learner's group once per
engine life, then per push receive (engine) and broadcast (learner hub) at the same time.

The handover is duck-typed (`agentrl.weights.push.CollectiveHandover`: `update_info` and
`call(hub_method, *args)`), so the rollout side never imports the learner; any other handover (a file
path, an object-store reference) goes to the member's file path.
"""

from __future__ import annotations

import asyncio
from typing import Any


class WeightsReplaced(RuntimeError):
    """The version to load is gone from the sender: a newer one was pushed and released it."""


def is_collective(handover: Any) -> bool:
    return hasattr(handover, "update_info") and hasattr(handover, "call")


async def load_into(member, handover: Any, version: int) -> float:
    """Load `version` into `member` (an `agentrl.rollout.fleet.Member`); returns the seconds generation
    was paused. A failure drops the group: the next push (or the restarted engine) builds a new one."""
    if not is_collective(handover):
        return await member.load_weights(handover, version)
    key = await join(member, handover.call)
    if not await handover.call("hold", key, version):
        # A newer push released these weights before this load began (an engine catching up after a
        # restart); nothing has started, so the group stays, and the caller loads the newer ones.
        raise WeightsReplaced(f"weights v{version} were replaced by a newer push before engine "
                              f"{member.index} could load them")
    try:
        # Receivers start first (on CPU they receive in the background, generating meanwhile); the
        # load pauses generation once the bytes are in (CPU) or as they arrive (GPU).
        await member.stage_weights(handover.update_info)
        pause, _ = await _both(member.load_weights_collective(handover.update_info, version),
                               handover.call("send", key, version))
        return pause
    except (Exception, asyncio.CancelledError):
        # Not BaseException: a coroutine closed by GeneratorExit (its task destroyed with the loop)
        # must not await again, or Python turns the close into a RuntimeError.
        member.group = None
        await asyncio.shield(handover.call("close", key))
        raise


def group_key(index: int, epoch: int) -> str:
    """The hub's name for engine `index`'s group in its life `epoch`. One name per life: the clean-up of
    a load that failed when an engine died (`close`) can reach the hub after the restarted engine has
    opened its new group, and must drop only the dead life's."""
    return f"engine{index}.{epoch}"


async def join(member, call) -> str:
    """Make sure `member`'s engine of this life is in a group with the hub (`call(hub_method, *args)`);
    returns the group's key."""
    key = group_key(member.index, member.epoch)
    if member.group != member.epoch:
        if member.group is not None:  # the group of an earlier life, whose engine is gone
            await call("close", group_key(member.index, member.group))
        init_info = await call("open", key, member.workers)
        # The receivers and the sender rendezvous together: neither returns until all have joined.
        await _both(member.join_weight_group(init_info), call("join", key))
        member.group = member.epoch
    return key


async def _both(receiving, sending) -> tuple[Any, Any]:
    """Run both sides of a collective; the first failure ends the wait for the other. A dead engine
    never answers its side, and a sender blocked in a broadcast to a dead peer ends at the group's
    timeout on its own thread, so neither is waited for once the other has failed."""
    tasks = [asyncio.ensure_future(receiving), asyncio.ensure_future(sending)]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
        return tasks[0].result(), tasks[1].result()
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
                t.add_done_callback(_quiet)


def _quiet(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned side's late failure is not an unhandled error
