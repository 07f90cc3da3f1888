"""K DeepSpeed learner ranks as Ray actors, seen by the driver through the `Learner` interface.

Rank 0 picks the rendezvous (its node's address and a free port); every rank then builds its
`Learner` with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, which joins one torch.distributed
group (gloo on CPU, nccl on GPU) under DeepSpeed. Each step puts the batch into the object store once
and every rank reads it; `Learner.step` splits the work (see `agentrl.learner.rl`).

A rank that dies ends the run with `LearnerRankDied` as soon as Ray reports it: the survivors would
otherwise wait in a collective for a peer that never comes, so they are killed too.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import torch

from agentrl.weights import collective
from agentrl.config import ClusterConfig
from agentrl.learner.rl import Learner, StepMetrics
from agentrl.learner.step_parts import weighted

log = logging.getLogger(__name__)


class LearnerRankDied(RuntimeError):
    """A learner rank's process died (or failed to start); the run cannot go on without it."""


def node_address(interface: str) -> str:
    """This node's address on `interface` when one is named, else the one Ray knows it by."""
    import ray

    return collective.interface_address(interface) if interface else ray.util.get_node_ip_address()


class LearnerRank:
    """One rank (wrapped by `ray.remote` in `RayLearner`)."""

    def __init__(self, rank: int, world: int, num_threads: int) -> None:
        self.rank, self.world = rank, world
        torch.set_num_threads(num_threads)
        self.learner: Learner | None = None
        self.hub = None  # rank 0's SenderHub, with the collective weight path (open_hub)

    def rendezvous(self, interface: str = "") -> tuple[str, int]:
        """Where rank 0's store will listen: `interface`'s address (`cluster.interface`), else the
        address Ray knows this node by."""
        from agentrl.learner.dist import free_port

        return node_address(interface), free_port()

    def setup(self, master: tuple[str, int], build: Callable[[], Learner], key: str = "") -> dict[str, Any]:
        """`key`: the ranks' rendezvous secret (hex), through Ray's task arguments, never argv or a file;
        `agentrl.learner.dist.rank_store` seals the store with it and takes it out of the environment."""
        import ray

        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world), LOCAL_RANK="0",
                          MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), AGENTRL_RANKS_KEY=key)
        self.learner = build()
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def step(self, batch) -> list[StepMetrics]:
        metrics = self.learner.step(batch)
        if self.rank:  # every rank holds the same gathered per-token values; rank 0's are the ones kept
            for m in metrics:
                m.token_values = None
        return metrics

    def publish(self, version: int, dtype: torch.dtype | None):
        """Every rank takes part (a ZeRO-3 gather is collective); rank 0 puts the safetensors bytes
        into the object store and returns [reference, size]."""
        import numpy as np
        import ray

        from agentrl.weights.sync import snapshot_bytes

        state = self.learner.state_dict_cpu(clone=False)
        if self.rank != 0:
            return None
        blob = snapshot_bytes(state, dtype)
        return [ray.put(np.frombuffer(blob, dtype=np.uint8)), len(blob)]

    def open_hub(self, timeout_s: float, bucket_bytes: int, interface: str = "") -> None:
        """Rank 0: the sending end of the collective weight path, on `interface` (`cluster.interface`),
        else on the address Ray knows this node by; on loopback when that is a loopback address."""
        from agentrl.weights.push import SenderHub

        device = "cuda" if torch.cuda.is_available() else "cpu"
        host = node_address(interface)
        network = collective.Network(local=collective.is_loopback(host), interface=interface)
        self.hub = SenderHub(host, timeout_s, bucket_bytes, device, network)

    def publish_packed(self, version: int, dtype: torch.dtype | None):
        """Every rank takes part (a ZeRO-3 gather is collective); rank 0 packs the weights into its hub
        and returns [update info, bytes]."""
        state = self.learner.state_dict_cpu(clone=False)
        if self.rank != 0:
            return None
        return list(self.hub.publish(version, state, dtype))

    def hub_call(self, name: str, *args):
        """Rank 0's hub methods (open / join / send / release / close), each on its own actor thread:
        a broadcast blocks, and runs while the next learner step does."""
        return getattr(self.hub, name)(*args)

    def save(self, out_dir: str, tokenizer) -> None:
        self.learner.save(out_dir, tokenizer)

    def save_checkpoint(self, folder: str) -> None:
        self.learner.save_checkpoint(folder)

    def load_checkpoint(self, folder: str) -> tuple[int, dict[str, float]]:
        digest = self.learner.load_checkpoint(folder)
        return self.learner.version, digest


def merge_rank_metrics(per_rank: list[list[StepMetrics]]) -> list[StepMetrics]:
    """One StepMetrics per optimizer step from every rank's: losses add (each rank's is already its
    share of the step's), policy metrics average weighted by each rank's share of the tokens
    (max/min keys stay max/min), the slowest rank's time counts. The critic's loss is, like `loss`, each
    rank's share of the step's: it adds too."""
    merged = []
    for steps in zip(*per_rank):
        first = steps[0]
        merged.append(StepMetrics(
            loss=sum(m.loss for m in steps), grad_norm=first.grad_norm,
            step_time_s=max(m.step_time_s for m in steps), n_episodes=first.n_episodes,
            n_tokens=first.n_tokens, policy=weighted([(m.share, m.policy) for m in steps]),
            share=sum(m.share for m in steps), token_values=first.token_values,  # the same on every rank
            critic_loss=None if first.critic_loss is None else sum(m.critic_loss for m in steps)))
    return merged


class RayLearner:
    """The driver's handle on the ranks: `step`, `version`, `publish`, `save`, `shutdown`."""

    def __init__(self, build: Callable[[], Learner], cluster: ClusterConfig, num_threads: int = 1) -> None:
        self.build, self.cluster, self.num_threads = build, cluster, num_threads
        self.ranks: list[Any] = []
        self.where: list[dict[str, Any]] = []
        self.version = 0

    def start(self) -> None:
        import ray

        world = self.cluster.learner_ranks
        remote = ray.remote(LearnerRank)
        env = {"OMP_NUM_THREADS": str(self.num_threads)}
        if not self.cluster.learner_num_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""  # Ray leaves every GPU visible to an actor that asked for none
        opts = {"num_cpus": self.cluster.learner_num_cpus, "num_gpus": self.cluster.learner_num_gpus,
                "runtime_env": {"env_vars": env}}
        if self.cluster.learner_resources:  # the nodes that offer them (`ray start --resources`)
            opts["resources"] = dict(self.cluster.learner_resources)
        # Rank 0 also runs the weight hub's calls: a broadcast (or a group join) per engine at once,
        # beside a learner step, each on an actor thread of its own.
        self.ranks = [remote.options(**opts, max_concurrency=4 + 2 * self.cluster.engines if r == 0 else 1)
                      .remote(r, world, self.num_threads) for r in range(world)]
        t0 = time.perf_counter()
        master = self._wait([self.ranks[0].rendezvous.remote(self.cluster.interface)], "start",
                            self.cluster.start_timeout_s)[0]
        key = collective.new_key().hex()  # one per start: a stranger on the rendezvous port cannot steer it
        self.where = self._wait([a.setup.remote(master, self.build, key) for a in self.ranks], "start",
                                self.cluster.start_timeout_s)
        log.info("%d learner rank(s) up in %.1fs (rendezvous %s:%d)", world, time.perf_counter() - t0, *master)

    def node_ids(self) -> frozenset[str]:
        return frozenset(w["node_id"] for w in self.where)

    def step(self, batch) -> list[StepMetrics]:
        import ray

        ref = ray.put(batch)
        metrics = merge_rank_metrics(self._wait([a.step.remote(ref) for a in self.ranks], "a learner step"))
        self.version += len(metrics)
        return metrics

    def publish(self, version: int, dtype: torch.dtype | None) -> tuple[Any, int]:
        """(object-store reference to the weights as safetensors bytes, their size)."""
        ref, size = self._wait([a.publish.remote(version, dtype) for a in self.ranks], "a weight snapshot")[0]
        return ref, size

    def open_hub(self, timeout_s: float, bucket_bytes: int) -> None:
        self._wait([self.ranks[0].open_hub.remote(timeout_s, bucket_bytes, self.cluster.interface)],
                   "opening the weight hub")

    def publish_packed(self, version: int, dtype: torch.dtype | None) -> tuple[dict, int]:
        """Rank 0 packs the weights for the collective path: (update info, bytes)."""
        info, size = self._wait([a.publish_packed.remote(version, dtype) for a in self.ranks], "a weight snapshot")[0]
        return info, size

    def save(self, out_dir: str, tokenizer) -> None:
        self._wait([a.save.remote(out_dir, tokenizer) for a in self.ranks], "saving the model")

    def save_checkpoint(self, folder: str) -> None:
        """Every rank writes its part into `folder` (a folder every node can reach, on several nodes)."""
        self._wait([a.save_checkpoint.remote(folder) for a in self.ranks], "writing a checkpoint")

    def load_checkpoint(self, folder: str) -> dict[str, float]:
        """Rank 0's restored optimizer digest; the driver's version follows the ranks'."""
        self.version, digest = self._wait([a.load_checkpoint.remote(folder) for a in self.ranks],
                                          "loading a checkpoint")[0]
        return digest

    def _wait(self, refs: list, what: str, timeout_s: float | None = None) -> list:
        """Results in rank order; the first rank to fail ends every rank and raises `LearnerRankDied`."""
        import ray

        pending, deadline = list(refs), None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                self.shutdown()
                raise LearnerRankDied(f"learner ranks did not finish {what} within {timeout_s:g}s")
            try:
                ray.get(ready[0])
            except Exception as exc:
                rank = refs.index(ready[0])
                self.shutdown()
                raise LearnerRankDied(self._death(rank, what, exc)) from exc
        return ray.get(refs)

    def _death(self, rank: int, what: str, exc: Exception) -> str:
        """What ended the run, where, and how to go on: the newest checkpoint holds every finished step."""
        from ray.exceptions import RayActorError

        text = str(exc).strip()
        node = self.where[rank]["node_id"][:12] if rank < len(self.where) else "?"
        where = f" on node {node}" if node != "?" else ""
        line = f"learner rank {rank}{where} failed during {what}: {type(exc).__name__}: " + \
            (text.splitlines()[-1] if text else "")
        if isinstance(exc, RayActorError):  # its process or node is gone, not a bug in the step
            line += ("; the run stopped. Run the same command with train.resume=auto to go on from the newest "
                     "checkpoint, once the cluster can hold the learner ranks again")
        return line

    def shutdown(self) -> None:
        import ray

        for actor in self.ranks:
            ray.kill(actor, no_restart=True)
        self.ranks = []
