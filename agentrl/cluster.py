"""Connecting to Ray for `cluster.backend: ray`: start a local Ray, or join a running cluster.

Multi-node: `ray start --head` on one node and `ray start --address=HEAD:6379` on the others, then
`python -m agentrl.train ... cluster.backend=ray cluster.address=auto` on any of them. What the run
asks for is checked against what the cluster has before any actor starts: Ray would otherwise wait
forever for resources that never come.
"""

from __future__ import annotations

import logging
import math
import os

from agentrl.config import ClusterConfig

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """The cluster cannot be reached, or cannot hold what the run asks for."""


def needed(cfg: ClusterConfig) -> dict[str, float]:
    return {"CPU": cfg.engines * cfg.engine_num_cpus + cfg.learner_ranks * cfg.learner_num_cpus,
            "GPU": cfg.engines * cfg.engine_num_gpus + cfg.learner_ranks * cfg.learner_num_gpus}


def connect(cfg: ClusterConfig) -> None:
    """ray.init for this run (once per process). A local Ray gets as many logical CPUs as the run
    reserves, at least the machine's: Ray's CPUs are scheduling tokens, not pinned cores."""
    import ray

    if ray.is_initialized():
        return
    env = {"env_vars": {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
                        "TOKENIZERS_PARALLELISM": "false"}}
    want = needed(cfg)
    if cfg.address is None:
        from agentrl.learner.dist import usable_cores

        cpus = max(usable_cores(), math.ceil(want["CPU"]))
        # address="local": a new Ray of our own, even when `ray start` left a cluster running here
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, runtime_env=env,
                 logging_level=logging.WARNING)
        log.info("started a local Ray with %d CPUs", cpus)
    else:
        try:
            ray.init(address=cfg.address, runtime_env=env, logging_level=logging.WARNING)
        except ConnectionError as exc:
            raise ClusterError(f"cluster.address={cfg.address!r}: no Ray cluster there ({exc}); start one with "
                               f"`ray start --head`") from None
    have = ray.cluster_resources()
    short = [f"{k}: needs {v:g}, the cluster has {have.get(k, 0):g}" for k, v in want.items() if v > have.get(k, 0)]
    if short:
        ray.shutdown()
        raise ClusterError("the Ray cluster cannot hold this run (" + "; ".join(short) + "); lower "
                           "cluster.engine_num_cpus/learner_num_cpus (or _gpus) or add nodes")
    log.info("Ray cluster: %d node(s), %s", len([n for n in ray.nodes() if n["Alive"]]), have)


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
