"""Weights in buckets for the collective path's broadcasts.

Why buckets: one broadcast per tensor costs a round trip each (hundreds of tensors); one broadcast of
the whole model needs a second full copy on the receiving side. Tensors are packed back to back into
uint8 buffers of at most `bucket_bytes` (a tensor larger than that travels alone, unpacked), so the
receiver holds at most one bucket beyond the model while it loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 64  # every tensor starts on a 64-byte boundary of its bucket, so its view needs no copy


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name without "torch.", as vLLM's weight-transfer update info spells it
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * getattr(torch, self.dtype).itemsize


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
