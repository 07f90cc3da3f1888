"""One vLLM engine inside a Ray actor, so a fleet can spread engines over the GPUs and nodes of a cluster.

The actor is asynchronous: Ray runs its methods as tasks on the actor's one event loop, which is
the loop the engine's `AsyncLLM` lives on for its whole life, and many requests run at once.
Weights arrive as a safetensors file's bytes from the object store (read there without a copy);
the actor writes them to its node's shared memory and the vLLM worker reads that file by name.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from agentrl.config import ClusterConfig, EngineConfig
from agentrl.rollout.engine import Engine, Generation
from agentrl.weights.handover import write_handover
from agentrl.rollout.members import OnEngine

log = logging.getLogger(__name__)


def cpu_binding(index: int, num_cpus: float) -> str:
    """Cores for engine `index`'s OpenMP threads (VLLM_CPU_OMP_THREADS_BIND): consecutive blocks of the
    node's cores, so engines sharing a node do not spin on the same ones."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    k = max(1, int(num_cpus))
    start = (index * k) % len(cores)
    picked = (cores + cores)[start:start + min(k, len(cores))]
    return ",".join(str(c) for c in picked)


def engine_ask(cluster: ClusterConfig) -> dict[str, float]:
    """The resources one engine actor asks for (those it asks none of left out)."""
    ask = {"CPU": cluster.engine_num_cpus, "GPU": cluster.engine_num_gpus, **cluster.engine_resources}
    return {k: v for k, v in ask.items() if v > 0}


def live_nodes(avoid: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The live nodes of the Ray cluster not in `avoid` (one read of the cluster's state)."""
    import ray

    return [n for n in ray.nodes() if n["Alive"] and n["NodeID"] not in avoid]


def engine_nodes(cluster: ClusterConfig, avoid: frozenset[str] = frozenset(),
                 nodes: list[dict[str, Any]] | None = None) -> list[str]:
    """Ids of the live nodes an engine fits on: not in `avoid`, with the CPUs, GPUs and custom resources
    an engine asks for. Read at each actor's start, so a restart after a node's loss picks a survivor."""
    ask = engine_ask(cluster)
    return [n["NodeID"] for n in (live_nodes(avoid) if nodes is None else nodes)
            if all(n["Resources"].get(k, 0) >= v for k, v in ask.items())]


def engine_capacity(cluster: ClusterConfig, avoid: frozenset[str] = frozenset(),
                    nodes: list[dict[str, Any]] | None = None) -> float:
    """How many engines the live nodes (not in `avoid`) can hold at once, by each node's total CPUs,
    GPUs and custom resources against one engine's ask. A node's loss lowers it: when it falls below
    the engines the run keeps, a restart would wait for ever for room that never comes."""
    ask = engine_ask(cluster)
    if not ask:
        return math.inf
    return sum(min(math.floor(n["Resources"].get(k, 0) / v + 1e-9) for k, v in ask.items())
               for n in (live_nodes(avoid) if nodes is None else nodes))


def actor_options(cluster: ClusterConfig, index: int, avoid: frozenset[str], nodes: list[str]) -> dict[str, Any]:
    """`ray.remote(...).options` of engine `index`, given the live `nodes` that can hold it
    (`engine_nodes`). Engines spread over them, so that a node's loss takes as few as possible; `avoid`
    (the learner's nodes, `cluster.colocate: false`) pins each to one of them instead."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # vLLM's log level reaches the actors through the job's runtime_env (agentrl.run.cluster.connect).
    opts: dict[str, Any] = {"num_cpus": cluster.engine_num_cpus, "num_gpus": cluster.engine_num_gpus,
                            "scheduling_strategy": "SPREAD"}
    if cluster.engine_resources:
        opts["resources"] = dict(cluster.engine_resources)
    if cluster.engine_num_gpus <= 0:  # Ray leaves every GPU visible to an actor that asked for none
        opts["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
    if not nodes:  # its node is gone and no other can hold it (a restart): the fleet counts a failed restart
        raise RuntimeError(f"no live node of the Ray cluster can hold engine {index}"
                           + (" without a learner rank (cluster.colocate=false)" if avoid else "")
                           + f" (it asks for {cluster.engine_num_cpus:g} CPU, {cluster.engine_num_gpus:g} GPU"
                           + "".join(f", {v:g} {k}" for k, v in cluster.engine_resources.items()) + ")")
    if avoid:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes[index % len(nodes)], soft=False)
    return opts


class EngineActor(OnEngine):
    """Wrapped by `ray.remote` in `agentrl.rollout.fleet`; every method but the constructor is async."""

    def __init__(self, index: int, model_path: str, engine_cfg: dict[str, Any], eos_id: int,
                 tensor_parallel_size: int = 1, num_cpus: float = 1.0, on_gpu: bool = False) -> None:
        if not on_gpu:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(index, num_cpus)
        self.index, self.model_path, self.eos_id = index, model_path, eos_id
        self.cfg, self.tp = EngineConfig(**engine_cfg), tensor_parallel_size
        self.engine: Engine | None = None

    async def start(self) -> dict[str, Any]:
        """Start vLLM on this actor's event loop; returns where it runs."""
        import ray

        self.engine = Engine.start(self.model_path, self.cfg, self.eos_id, tensor_parallel_size=self.tp)
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation:
        return await self.engine.generate(prompt_ids, max_tokens, temperature, top_p, seed)

    async def alive(self) -> bool:
        return self.engine is not None and self.engine.healthy()

    async def load_weights(self, blob, version: int) -> float:
        """`blob`: the safetensors bytes (a uint8 array the object store hands over without a copy).
        Returns the seconds generation was paused."""
        t0 = time.perf_counter()
        path = write_handover(blob, f"agentrl-weights-actor{self.index}-{os.getpid()}-v{version}.safetensors")
        try:
            pause = await self.engine.load_weights_file(str(path), version)
        finally:
            path.unlink(missing_ok=True)
        log.debug("engine %d loaded v%d in %.2fs", self.index, version, time.perf_counter() - t0)
        return pause

    async def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
