"""Versioned weight pushes from the learner to the rollout engine, each with a deadline.

`WeightSync` is the interface; `EngineWeightSync` serialises a snapshot to safetensors bytes off
the event loop and loads it into the vLLM engine in place. Pushes are ordered (version n+1 never
overtakes n) and run in the background so the learner can start its next step at once; a push
that misses its deadline or fails is reported in `PushResult`, never hung on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

log = logging.getLogger(__name__)


@dataclass
class PushResult:
    version: int
    ok: bool
    latency_s: float  # snapshot serialisation + engine update
    bytes: int = 0
    error: str = ""


class WeightTarget(Protocol):
    version: int

    async def update_weights(self, blob: bytes, version: int) -> None: ...


class WeightSync(Protocol):
    async def push(self, version: int) -> None:
        """Snapshot the learner's weights as `version` and push them in the background."""

    async def drain(self) -> list[PushResult]:
        """Wait for pushes in flight and return the results not yet reported."""


def to_safetensors(state: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save(state)


class EngineWeightSync:
    def __init__(self, snapshot: Callable[[], dict[str, torch.Tensor]], target: WeightTarget,
                 deadline_s: float) -> None:
        self.snapshot, self.target, self.deadline_s = snapshot, target, deadline_s
        self.on_pushed: Callable[[int], None] | None = None  # told each version the engine now serves
        self._last: asyncio.Task | None = None
        self._results: list[PushResult] = []

    async def push(self, version: int) -> None:
        # Take the snapshot before returning (the learner is between steps) so the bytes are exactly
        # the weights of `version`, even if the learner starts the next step before the push lands.
        state = await asyncio.to_thread(self.snapshot)
        previous = self._last
        self._last = asyncio.get_running_loop().create_task(self._push(state, version, previous))

    async def _push(self, state: dict[str, torch.Tensor], version: int, previous: asyncio.Task | None) -> None:
        if previous is not None:
            await asyncio.shield(previous)
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.deadline_s):
                blob = await asyncio.to_thread(to_safetensors, state)
                await self.target.update_weights(blob, version)
            result = PushResult(version, True, time.perf_counter() - t0, len(blob))
        except TimeoutError:
            result = PushResult(version, False, time.perf_counter() - t0, error=f"deadline {self.deadline_s}s exceeded")
        except Exception as exc:  # reported, and the next push is still attempted
            result = PushResult(version, False, time.perf_counter() - t0, error=repr(exc))
        if result.ok and self.on_pushed is not None:
            self.on_pushed(version)
        if not result.ok:
            log.error("weight push v%d failed: %s", version, result.error)
        self._results.append(result)

    def take_results(self) -> list[PushResult]:
        out, self._results = self._results, []
        return out

    async def drain(self) -> list[PushResult]:
        if self._last is not None:
            await asyncio.shield(self._last)
        return self.take_results()
