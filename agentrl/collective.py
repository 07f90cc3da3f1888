"""The collective weight path's wire: a torch.distributed group of its own between one learner process
(rank 0, the sender) and one engine's vLLM workers (ranks 1..), and the bucketed broadcast of a weight
snapshot through it. Both ends import this module and nothing else of each other.

Why a group of its own: the learner's DeepSpeed ranks and vLLM's workers each already have a default
group; this one is built from its own TCPStore so it touches neither, and it is rebuilt from scratch
for a restarted engine. Gloo on CPU, NCCL on GPU: the same calls (`ProcessGroup.broadcast`).

Why buckets: one broadcast per tensor costs a round trip each (hundreds of tensors); one broadcast of
the whole model needs a second full copy on the receiving side. Tensors are packed back to back into
uint8 buffers of at most `bucket_bytes` (a tensor larger than that travels alone, unpacked), so the
receiver holds at most one bucket beyond the model while it loads.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Iterator

import torch

ALIGN = 64  # every tensor starts on a 64-byte boundary of its bucket, so its view needs no copy


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name without "torch.", as vLLM's weight-transfer update info spells it
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True)
class Bucket:
    """Tensors `first..last-1` of the metadata, at `offsets` within a buffer of `size` bytes."""

    first: int
    last: int
    offsets: tuple[int, ...]
    size: int


def metadata(state: dict[str, torch.Tensor]) -> list[TensorMeta]:
    return [TensorMeta(k, str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in state.items()]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_buckets(metas: list[TensorMeta], bucket_bytes: int) -> list[Bucket]:
    """Consecutive tensors, packed while the bucket stays within `bucket_bytes`; a tensor that alone
    exceeds it gets a bucket of its own. Both ends compute the same plan from the same metadata."""
    buckets: list[Bucket] = []
    first, offsets, size = 0, [], 0
    for i, m in enumerate(metas):
        start = _aligned(size)
        if offsets and start + m.nbytes > bucket_bytes:
            buckets.append(Bucket(first, i, tuple(offsets), size))
            first, offsets, start = i, [], 0
        offsets.append(start)
        size = start + m.nbytes
    if offsets:
        buckets.append(Bucket(first, len(metas), tuple(offsets), size))
    return buckets


def pack(tensors: list[torch.Tensor], bucket: Bucket, device: torch.device | str = "cpu") -> torch.Tensor:
    """The bucket's tensors as one uint8 buffer (a lone contiguous tensor is sent as itself: no copy)."""
    if bucket.last - bucket.first == 1 and tensors[0].is_contiguous() and tensors[0].device == torch.device(device):
        return tensors[0].reshape(-1).view(torch.uint8)
    buf = torch.empty(bucket.size, dtype=torch.uint8, device=device)
    for t, off in zip(tensors, bucket.offsets):
        flat = t.contiguous().reshape(-1).view(torch.uint8)
        buf[off:off + flat.numel()].copy_(flat)
    return buf


def unpack(buf: torch.Tensor, metas: list[TensorMeta], bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into `buf` for the bucket's tensors."""
    out = []
    for m, off in zip(metas[bucket.first:bucket.last], bucket.offsets):
        out.append((m.name, buf[off:off + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape)))
    return out


# -- the group ---------------------------------------------------------------------------------


def listen(host: str, world: int, timeout_s: float) -> torch.distributed.TCPStore:
    """Rank 0's store on a port the OS picks (`store.port`), so no two groups race for one."""
    return torch.distributed.TCPStore(host, 0, world, True, datetime.timedelta(seconds=timeout_s),
                                      wait_for_workers=False)


def join(store_or_addr: torch.distributed.TCPStore | tuple[str, int], rank: int, world: int, timeout_s: float,
         device: torch.device) -> torch.distributed.ProcessGroup:
    """Join the group as `rank` (blocks until all `world` ranks have joined, at most `timeout_s`).
    Every collective on it then fails after `timeout_s` instead of waiting for a peer forever."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = store_or_addr
    if isinstance(store_or_addr, tuple):
        store = torch.distributed.TCPStore(store_or_addr[0], store_or_addr[1], world, False, timeout)
    store = torch.distributed.PrefixStore("agentrl-weights", store)
    if device.type == "cuda":
        return _nccl_group(store, rank, world, timeout, device)
    return torch.distributed.ProcessGroupGloo(store, rank, world, timeout)


def _nccl_group(store, rank: int, world: int, timeout: datetime.timedelta,
                device: torch.device) -> torch.distributed.ProcessGroup:
    """NCCL connects at the first collective; connect now, so a group that cannot form fails its join
    (and `auto` falls back to files) rather than the first push. Error handling 2 (clean up only): a
    timed-out push aborts this group, where the default would kill the learner's process with it."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    opts = torch.distributed.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    old = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    try:
        group = torch.distributed.ProcessGroupNCCL(store, rank, world, opts)
    finally:
        if old is None:
            os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
        else:
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = old
    group.eager_connect_single_device(device)
    return group


def broadcast(group: torch.distributed.ProcessGroup, buf: torch.Tensor) -> None:
    group.broadcast(buf, 0).wait()


def receive(group: torch.distributed.ProcessGroup, metas: list[TensorMeta], buckets: list[Bucket],
            device: torch.device) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The receiving side of `send`: one list of (name, tensor) per bucket, as it arrives."""
    for b in buckets:
        buf = torch.empty(b.size, dtype=torch.uint8, device=device)
        broadcast(group, buf)
        yield unpack(buf, metas, b)
