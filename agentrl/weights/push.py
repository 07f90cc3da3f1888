"""The sending end of the collective weight path: learner rank 0's side of every engine's group.

A push packs the learner's weights (cast to the engine's dtype) into buckets once: the learner waits for
that copy, as it waits for the hand-over file on the file path, and may then step on while the buckets
are broadcast in the background. The packed snapshot is kept until the next push has landed, so a
restarted engine can load it.

`SenderHub` is synchronous and blocking (a broadcast waits for its receivers); in one process the
driver calls it through threads (`LocalHub`), on a Ray cluster learner rank 0's actor holds it and
the driver calls it there (`agentrl.learner.ray_ranks`). `CollectiveHandover` is what the engine fleet
receives per push, whichever holds the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import torch

from agentrl.weights import buckets, collective
log = logging.getLogger(__name__)


@dataclass
class PackedSnapshot:
    metas: list[buckets.TensorMeta]
    buffers: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.metas)

    def update_info(self) -> dict[str, Any]:
        """vLLM's weight-transfer update payload (agentrl.weights.receiver.UpdateInfo)."""
        return {"names": [m.name for m in self.metas], "dtype_names": [m.dtype for m in self.metas],
                "shapes": [list(m.shape) for m in self.metas]}


def pack_snapshot(state: dict[str, torch.Tensor], dtype: torch.dtype | None, bucket_bytes: int,
                  device: torch.device | str = "cpu") -> PackedSnapshot:
    """`state` cast to `dtype` (None keeps it) and copied into buckets: the copy never aliases the live
    parameters, so the learner may step while it is sent. A tied head is sent under both names."""
    if dtype is not None:
        metas = [buckets.TensorMeta(k, str(dtype).removeprefix("torch."), tuple(v.shape)) for k, v in state.items()]
    else:
        metas = buckets.metadata(state)
    tensors = list(state.values())
    buffers = []
    for b in buckets.plan_buckets(metas, bucket_bytes):
        part = [t.to(dtype) if dtype is not None else t for t in tensors[b.first:b.last]]
        buf = buckets.pack(part, b, device)
        # A lone tensor is packed as a view of itself: copy it, the learner's next step changes it.
        buffers.append(buf.clone() if any(buf.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                          for t in tensors[b.first:b.last]) else buf)
    return PackedSnapshot(metas, buffers)


@dataclass
class _Endpoint:
    store: Any
    world: int
    access: collective.Access
    group: Any = None


class SenderHub:
    """Rank 0's endpoints (one group per engine, keyed by the caller) and the snapshots being pushed.

    `host` is the address this node is known by; `network` says where the groups listen (default: on
    loopback only when `host` is a loopback address, as for the local backend, whose engines are this
    process's children). Each group gets a key of its own (agentrl.weights.collective: "Who can reach it"),
    handed to its receivers in `open`'s init info and nowhere else."""

    def __init__(self, host: str, timeout_s: float, bucket_bytes: int, device: str = "cpu",
                 network: collective.Network | None = None) -> None:
        self.host, self.timeout_s, self.bucket_bytes, self.device = host, timeout_s, bucket_bytes, device
        self.network = network if network is not None else collective.Network(local=collective.is_loopback(host))
        self._cuda = torch.device(device).type == "cuda"
        self.endpoints: dict[str, _Endpoint] = {}
        self.snapshots: dict[int, PackedSnapshot] = {}
        # Per group key, the version a load through it is about to send (`hold`); released versions
        # wait for their holds to end. The calls come from several threads.
        self._holds: dict[str, int] = {}
        self._released: set[int] = set()
        self._lock = threading.Lock()

    def publish(self, version: int, state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> tuple[dict, int]:
        snap = pack_snapshot(state, dtype, self.bucket_bytes, self.device)
        if self._cuda:
            torch.cuda.current_stream().synchronize()  # the copies land before another stream sends them
        with self._lock:
            self.snapshots[version] = snap
            self._drop_released()
        return snap.update_info(), snap.nbytes

    def release(self, version: int) -> None:
        """Drop `version` once it is neither the newest nor held: the newest stays until the hub closes,
        because an engine restarting after the last push (the run may be ending) catches up by loading
        it, and a held one until its send ends."""
        with self._lock:
            self._released.add(version)
            self._drop_released()

    def hold(self, key: str, version: int) -> bool:
        """Keep `version` until `key`'s send of it ends (or `key` closes); False if it is gone already.
        Taken before the receivers start waiting: an engine catching up after a restart reads the newest
        push it saw, and a newer push releasing that one meanwhile must not leave them waiting for a
        broadcast that never comes (each wait ends only at the group's timeout)."""
        with self._lock:
            if version not in self.snapshots:
                return False
            self._holds[key] = version
            return True

    def _unhold(self, key: str) -> None:
        with self._lock:
            self._holds.pop(key, None)
            self._drop_released()

    def _drop_released(self) -> None:
        newest, held = max(self.snapshots, default=None), set(self._holds.values())
        for version in [v for v in self._released if v != newest and v not in held]:
            self.snapshots.pop(version, None)
            self._released.discard(version)

    def open(self, key: str, workers: int) -> dict[str, Any]:
        """A new group for `key` with `workers` receivers; returns the receivers' init info. The old
        group of the same key, if any, is dropped (its engine restarted, or a push through it failed)."""
        self.close(key)
        address = collective.bind_address(self.network, self.host)
        store = collective.listen(address, 1 + workers, self.timeout_s)
        access = collective.Access(address, store.port, collective.new_key(), self.network)
        self.endpoints[key] = _Endpoint(store, 1 + workers, access)
        return {"master_address": address, "master_port": store.port, "rank_offset": 1,
                "world_size": 1 + workers, "timeout_s": self.timeout_s, "bucket_bytes": self.bucket_bytes,
                "backend": "nccl" if torch.device(self.device).type == "cuda" else "gloo",
                "secret": access.key.hex(), "local": self.network.local, "interface": self.network.interface}

    def join(self, key: str) -> None:
        """Join as rank 0; returns when every receiver has joined (or raises after the timeout)."""
        ep = self.endpoints[key]
        ep.group = collective.join(ep.store, 0, ep.world, self.timeout_s, torch.device(self.device), ep.access)

    def send(self, key: str, version: int) -> float:
        """Broadcast `version`'s buckets through `key`'s group; returns the seconds it took."""
        t0 = time.perf_counter()
        group = self.endpoints[key].group
        if version not in self.snapshots:
            raise RuntimeError(f"weights v{version} were released before this send (hold them first)")
        # On GPU a broadcast only queues on the current stream: send on a stream of its own (not the
        # learner's compute stream, which would wait for the push) and wait for it, so the time is real.
        stream = torch.cuda.Stream() if self._cuda else None
        try:
            with torch.cuda.stream(stream) if self._cuda else contextlib.nullcontext():
                for buf in self.snapshots[version].buffers:
                    collective.broadcast(group, buf)
            if stream is not None:
                stream.synchronize()
        finally:
            self._unhold(key)
        return time.perf_counter() - t0

    def close(self, key: str) -> None:
        """Drop `key`'s group. Not shut down: a broadcast to a dead peer may still hold it on another
        thread until the group's timeout, and a shutdown would wait for that; the last reference frees it."""
        self.endpoints.pop(key, None)
        self._unhold(key)

    def close_all(self) -> None:
        for key in list(self.endpoints):
            self.close(key)
        with self._lock:
            self.snapshots.clear()
            self._holds.clear()
            self._released.clear()


@dataclass
class CollectiveHandover:
    """One pushed version as the fleet sees it: what the receivers need, and the hub's methods as
    coroutines (`call(name, *args)`), wherever the hub lives."""

    version: int
    update_info: dict[str, Any]
    nbytes: int
    call: Callable[..., Awaitable[Any]] = field(repr=False)
    release: Callable[[], None] = field(repr=False)


class LocalHub:
    """A `SenderHub` in this process (the local backend), its blocking calls run in threads."""

    def __init__(self, snapshot: Callable[[], dict[str, torch.Tensor]], dtype: torch.dtype | None,
                 timeout_s: float, bucket_bytes: int) -> None:
        self.snapshot, self.dtype = snapshot, dtype
        # gloo, from host memory, even on a GPU machine: the local engine's worker sits on the driver's
        # cuda:0, and NCCL refuses two ranks on one GPU. The worker copies each bucket to its GPU.
        # Every engine is this process's child: the groups listen on loopback only.
        self.hub = SenderHub(collective.LOOPBACK, timeout_s, bucket_bytes, "cpu", collective.Network(local=True))

    async def call(self, name: str, *args) -> Any:
        return await asyncio.to_thread(getattr(self.hub, name), *args)

    def publish(self, version: int) -> tuple[CollectiveHandover, int]:
        info, nbytes = self.hub.publish(version, self.snapshot(), self.dtype)
        return CollectiveHandover(version, info, nbytes, self.call, lambda: self.hub.release(version)), nbytes

    def close(self) -> None:
        self.hub.close_all()


class RayHub:
    """The hub on learner rank 0's actor (`agentrl.learner.ray_ranks.LearnerRank.hub_call`): the weights
    are broadcast from where they were gathered, never through the driver or the object store."""

    def __init__(self, learner, dtype: torch.dtype | None, timeout_s: float, bucket_bytes: int) -> None:
        self.learner, self.dtype = learner, dtype
        learner.open_hub(timeout_s, bucket_bytes)

    async def call(self, name: str, *args) -> Any:
        return await self.learner.ranks[0].hub_call.remote(name, *args)

    def publish(self, version: int) -> tuple[CollectiveHandover, int]:
        info, nbytes = self.learner.publish_packed(version, self.dtype)
        rank0 = self.learner.ranks[0]
        return CollectiveHandover(version, info, nbytes, self.call,
                                  lambda: rank0.hub_call.remote("release", version)), nbytes

    def close(self) -> None:
        if self.learner.ranks:
            self.learner.ranks[0].hub_call.remote("close_all")
