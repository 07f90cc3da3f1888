"""Process groups and CPU budget for the learner: one process (gloo, in-memory store), or one of
several ranks whose RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT are set by torchrun or by
`agentrl.learner.ray_ranks`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch


def free_port() -> int:
    """A TCP port free on loopback now (the OS's pick; another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_dist() -> None:
    """One-process gloo group, as DeepSpeed expects a distributed context."""
    import deepspeed
    import deepspeed.ops

    from agentrl.weights import collective
    for key, val in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, val)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if int(os.environ["WORLD_SIZE"]) == 1 or not torch.cuda.is_available():
        # The shared-memory allreduce op costs a ~40 s C++ build on first use and helps only several
        # CPU ranks with large gradients; gloo carries them.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        world = int(os.environ["WORLD_SIZE"])
        if world == 1:
            # An in-memory store: no TCP port to pick, so no race with vLLM's or a server's sockets.
            # gloo still opens a listener for the group: on loopback, nobody else is in it.
            collective.keep_gloo_on_loopback()
            torch.distributed.init_process_group(backend=backend, store=torch.distributed.HashStore(),
                                                 rank=0, world_size=1)
        else:
            rank = int(os.environ["RANK"])
            torch.distributed.init_process_group(backend=backend, store=rank_store(rank, world),
                                                 rank=rank, world_size=world)
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())


def rank_store(rank: int, world: int) -> torch.distributed.Store:
    """The learner ranks' rendezvous at MASTER_ADDR:MASTER_PORT. Rank 0's store listens on that address
    only (torch's env:// store listens on every address); a loopback MASTER_ADDR (every rank on this
    node) keeps gloo on loopback too. With AGENTRL_RANKS_KEY (hex, set by whoever starts the ranks and
    removed from the environment here) the store is sealed with it (agentrl.weights.collective.SealedStore)."""
    from agentrl.weights import collective
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = torch.distributed.default_pg_timeout
    if collective.is_loopback(host):  # every rank on this node
        collective.keep_gloo_on_loopback()
    if rank == 0:
        store = collective.listen(host, world, timeout.total_seconds(), port=port)
    else:
        store = torch.distributed.TCPStore(host, port, world, False, timeout)
    key = os.environ.pop("AGENTRL_RANKS_KEY", "")
    if not key:
        return store
    sealed = collective.SealedStore(store, bytes.fromhex(key))
    _KEPT.append(sealed)  # a store written in Python dies with its last Python reference (collective.Group)
    return sealed


_KEPT: list = []  # the ranks' sealed store, for the process's life (the default group's)


def gather_rows(own_rows: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's rows of a (B, T) tensor, in rank order, from this rank's equal share of them."""
    if world == 1:
        return own_rows
    parts = [torch.empty_like(own_rows) for _ in range(world)]
    torch.distributed.all_gather(parts, own_rows)
    return torch.cat(parts)


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota if one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cores
