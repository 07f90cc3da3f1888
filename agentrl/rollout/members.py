"""One engine's slot in an `agentrl.rollout.fleet.EngineFleet`: how it starts, serves, loads weights
and dies, in this process (`LocalMember`) or as a Ray actor (`RayMember`).

A weight load comes by one of two paths: a hand-over file or object-store reference
(`load_weights`), or the collective path (`join_weight_group` once per engine life, then
`stage_weights` and `load_weights_collective` per push, driven by `agentrl.weights.load`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from agentrl.config import EngineConfig
from agentrl.rollout.engine import Engine, Generation


@dataclass
class Member:
    """One engine's slot in the fleet; subclasses say how it starts, serves and dies."""

    index: int
    version: int = 0
    episodes: int = 0  # live leases
    served: int = 0  # leases ever taken (episodes routed here)
    healthy: bool = False
    restarts: int = 0
    retired: bool = False  # gave up on after its last restart, while other engines serve: never restarted
    epoch: int = 0  # bumped at each restart: a load begun on the dead engine must not set a version
    last_error: str = ""
    where: dict[str, Any] = field(default_factory=dict)
    load_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight load at a time, in order
    workers: int = 1  # vLLM workers (tensor parallel ranks): the receivers of a collective push
    group: int | None = None  # the epoch whose engine joined the weight group (collective path); None: none

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def generate(self, *args) -> Generation: ...
    async def stream(self, *args) -> AsyncIterator[Generation]:  # deltas; a Ray engine's turn is one piece
        yield await self.generate(*args)
    async def load_weights(self, handover: Any, version: int) -> float: ...
    async def join_weight_group(self, init_info: dict) -> None: ...
    async def stage_weights(self, update_info: dict) -> None: ...
    async def load_weights_collective(self, update_info: dict, version: int) -> float: ...
    async def alive(self) -> bool: ...
    def is_death(self, exc: BaseException) -> bool:
        """Whether `exc` itself proves the engine is gone (no need to ask it)."""
        return False


class OnEngine:
    """The collective path's calls, passed on to `self.engine`, an `Engine` in this process (a local
    member's, or the Ray engine actor's)."""

    engine: Engine | None

    async def join_weight_group(self, init_info: dict) -> None:
        await self.engine.join_weight_group(init_info)

    async def stage_weights(self, update_info: dict) -> None:
        await self.engine.stage_weights(update_info)

    async def load_weights_collective(self, update_info: dict, version: int) -> float:
        return await self.engine.load_weights_collective(update_info, version)


@dataclass
class LocalMember(OnEngine, Member):
    """An `Engine` on this process's event loop; `handover` is the path of a safetensors file."""

    model_path: str = ""
    cfg: EngineConfig | None = None
    eos_id: int = 0
    engine: Engine | None = None

    async def start(self) -> None:
        self.engine = Engine.start(self.model_path, self.cfg, self.eos_id)
        self.version = 0

    async def stop(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):  # a dead core fails its own shutdown; the process is gone
                self.engine.shutdown()
            self.engine = None

    async def generate(self, *args) -> Generation:
        return await self.engine.generate(*args)

    async def stream(self, *args) -> AsyncIterator[Generation]:
        async for delta in self.engine.stream(*args):
            yield delta

    async def load_weights(self, handover: Any, version: int) -> float:
        return await self.engine.load_weights_file(str(handover), version)

    async def alive(self) -> bool:
        return self.engine is not None and self.engine.healthy()

    def is_death(self, exc: BaseException) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError

        return isinstance(exc, EngineDeadError)


@dataclass
class RayMember(Member):
    """An `EngineActor`; `handover` is an object-store reference to the safetensors bytes."""

    make_actor: Callable[[int], Any] | None = None
    start_timeout_s: float = 600.0
    actor: Any = None

    async def start(self) -> None:
        self.actor = self.make_actor(self.index)
        async with asyncio.timeout(self.start_timeout_s):
            self.where = await self.actor.start.remote()
        self.version = 0

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(30):
                    await self.actor.shutdown.remote()
            ray.kill(self.actor, no_restart=True)
            self.actor = None

    async def generate(self, *args) -> Generation:
        import ray

        ref = self.actor.generate.remote(*args)
        try:
            return await ref
        except asyncio.CancelledError:
            # Cancelling the await leaves the actor's task running; ray.cancel interrupts the actor's async
            # generate, whose vLLM stream then aborts the request (a client left, a deadline passed).
            ray.cancel(ref)
            raise

    async def load_weights(self, handover: Any, version: int) -> float:
        return await self.actor.load_weights.remote(handover, version)

    async def join_weight_group(self, init_info: dict) -> None:
        await self.actor.join_weight_group.remote(init_info)

    async def stage_weights(self, update_info: dict) -> None:
        await self.actor.stage_weights.remote(update_info)

    async def load_weights_collective(self, update_info: dict, version: int) -> float:
        return await self.actor.load_weights_collective.remote(update_info, version)

    async def alive(self) -> bool:
        try:
            async with asyncio.timeout(30):
                return await self.actor.alive.remote()
        except Exception:
            return False

    def is_death(self, exc: BaseException) -> bool:
        """A RayActorError of this engine's actor. One of another actor (the learner rank whose hub a
        collective load waits on, when that rank's node dies) says nothing about this engine."""
        from ray.exceptions import RayActorError

        if not isinstance(exc, RayActorError):
            return False
        mine = getattr(self.actor, "_actor_id", None)
        return exc.actor_id is None or mine is None or exc.actor_id == mine.hex()
