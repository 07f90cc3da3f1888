"""Versioned weight pushes from the learner to the rollout engine, each with a deadline.

`WeightSync` is the interface; `EngineWeightSync` runs the pushes, in order, through one of two
transports (`weight_sync.transport`):
- collective (auto's choice where every engine joins its group): `publish` is a hub's
  (agentrl.weights.push): the snapshot is packed into buckets and broadcast through a
  torch.distributed group into each engine's workers;
- file: the learner writes its weights once as a safetensors file under /dev/shm (a RAM-backed
  filesystem) and the engine's worker reads that file by name, so only a path crosses the RPC. The
  pickled-bytes path it replaced cost 16 s per push for a 538 MB model, nearly all of it in the RPC
  transport (measured when it was replaced); this one costs a memory copy on each side plus vLLM's `reload_weights`.

Pushes are ordered (version n+1 never overtakes n) and run in the background so the learner can
start its next step at once; a push that misses its deadline or fails is reported in `PushResult`,
never hung on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from agentrl.utils import faults
from agentrl.weights.handover import create_exclusive, handover_path
from agentrl.weights.handover import publish as publish_file

log = logging.getLogger(__name__)


@dataclass
class PushResult:
    version: int
    ok: bool
    latency_s: float  # from the snapshot's start until the engine serves the version
    bytes: int = 0
    snapshot_s: float = 0.0  # writing the weights to the hand-over file (the learner waits for this)
    pause_s: float = 0.0  # generation paused while the engine loads (the rollout waits for this)
    error: str = ""


class WeightTarget(Protocol):
    version: int

    async def load_weights_file(self, path: str, version: int) -> float:
        """Load the safetensors file at `path` as `version`; returns the seconds generation was paused."""


class WeightSync(Protocol):
    async def push(self, version: int) -> None:
        """Snapshot the learner's weights as `version` and push them in the background."""

    async def drain(self) -> list[PushResult]:
        """Wait for pushes in flight and return the results not yet reported."""


def push_dtype(engine_dtype: str) -> torch.dtype | None:
    """Send weights in the dtype the engine serves (half the bytes for bfloat16); None keeps float32."""
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(engine_dtype)


def write_snapshot(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None) -> int:
    """Write `state` (cast to `dtype` when the engine serves another dtype) as one safetensors file,
    atomically: the engine never sees a half-written file. Returns the bytes written."""
    from safetensors.torch import save_file

    # The name is claimed here, exclusively and 0600 (agentrl.weights.handover: a planted file or symlink
    # is refused); safetensors then writes it (0.8 through a 0600 temp file of its own that it renames
    # onto the name; older ones in place). 0600 is set again on what it left, never through a symlink.
    tmp = path.with_name(path.name + ".part")
    os.close(create_exclusive(tmp))
    try:
        save_file(_for_engine(state, dtype), str(tmp))
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    publish_file(tmp, path)
    return path.stat().st_size


def snapshot_bytes(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> bytes:
    """`state` as the bytes of a safetensors file (for the object store, when engines are Ray actors)."""
    from safetensors.torch import save

    return save(_for_engine(state, dtype))


def _for_engine(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Cast to the engine's dtype (when it serves another) and unshare tied tensors, for safetensors."""
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    return _unshared(state)


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (a tied lm_head aliases the embedding); vLLM
    wants both names, so a repeated one is written as its own copy."""
    seen: set[int] = set()
    out = {}
    for name, t in state.items():
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


class EngineWeightSync:
    """`snapshot()` returns the learner's weights as CPU tensors; they may alias the live parameters,
    because the file is written before `push` returns, while the learner is between steps.

    `publish(version) -> (handover, bytes)` replaces the file when the snapshot is made elsewhere (Ray
    learner ranks put it into the object store; the handover is then a reference). The newest handover
    is kept until the next push has landed, so an engine that restarts can load it."""

    def __init__(self, snapshot: Callable[[], dict[str, torch.Tensor]] | None, target: WeightTarget,
                 deadline_s: float, dtype: torch.dtype | None = None, folder: str | None = None,
                 publish: Callable[[int], tuple[Any, int]] | None = None) -> None:
        self.snapshot, self.target, self.deadline_s = snapshot, target, deadline_s
        self.dtype, self.folder = dtype, folder
        self.publish = publish or self._write
        self._kept: Any = None  # the newest handover that has landed
        self.on_pushed: Callable[[int], None] | None = None  # told each version the engine now serves
        self._last: asyncio.Task | None = None
        self._results: list[PushResult] = []
        self._tag = f"agentrl-weights-{os.getpid()}-{id(self):x}"

    def _write(self, version: int) -> tuple[Path, int]:
        state = self.snapshot()
        need = sum(v.numel() * (v.element_size() if self.dtype is None else self.dtype.itemsize)
                   for v in state.values())
        path = handover_path(self.folder, need, f"{self._tag}-v{version}.safetensors")
        return path, write_snapshot(state, path, self.dtype)

    async def push(self, version: int) -> None:
        t0 = time.perf_counter()
        try:
            handover, size = await asyncio.to_thread(self.publish, version)
        except Exception as exc:  # e.g. the hand-over folder is full: reported like a failed load
            log.error("weight push v%d failed to write its snapshot: %r", version, exc)
            self._results.append(PushResult(version, False, time.perf_counter() - t0, error=repr(exc)))
            return
        snapshot_s = time.perf_counter() - t0
        faults.reached("weight_push")  # the snapshot is written; no engine has loaded it
        previous = self._last
        self._last = asyncio.get_running_loop().create_task(
            self._push(handover, size, version, previous, t0, snapshot_s))

    async def _push(self, handover: Any, size: int, version: int, previous: asyncio.Task | None,
                    t0: float, snapshot_s: float) -> None:
        if previous is not None:
            await asyncio.shield(previous)
        try:
            async with asyncio.timeout(self.deadline_s):
                pause_s = await self.target.load_weights_file(_arg(handover), version)
            result = PushResult(version, True, time.perf_counter() - t0, size, snapshot_s, pause_s)
        except TimeoutError:
            result = PushResult(version, False, time.perf_counter() - t0, size, snapshot_s,
                                error=f"deadline {self.deadline_s}s exceeded")
        except Exception as exc:  # reported, and the next push is still attempted
            result = PushResult(version, False, time.perf_counter() - t0, size, snapshot_s, error=repr(exc))
        finally:
            _release(self._kept)
            self._kept = handover
        if result.ok and self.on_pushed is not None:
            self.on_pushed(version)
        if not result.ok:
            log.error("weight push v%d failed: %s", version, result.error)
        self._results.append(result)

    async def landed(self) -> list[PushResult]:
        """Wait for the pushes in flight (the newest handover is kept); return the unreported results."""
        if self._last is not None:
            await asyncio.shield(self._last)
        return self.take_results()

    def take_results(self) -> list[PushResult]:
        out, self._results = self._results, []
        return out

    async def drain(self) -> list[PushResult]:
        """Wait for the pushes in flight, release the last handover, return the unreported results."""
        results = await self.landed()
        _release(self._kept)
        self._kept = None
        return results


def _arg(handover: Any) -> Any:
    return str(handover) if isinstance(handover, Path) else handover


def _release(handover: Any) -> None:
    if isinstance(handover, Path):
        handover.unlink(missing_ok=True)
    elif callable(getattr(handover, "release", None)):  # a collective snapshot held by the sender
        handover.release()
