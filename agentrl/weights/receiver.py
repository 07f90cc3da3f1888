"""The receiving end of the collective weight path inside each vLLM worker, as a backend of vLLM's own
RL weight-transfer interface (`vllm.distributed.weight_transfer`): the engine is built with
`weight_transfer_config={"backend": "agentrl"}`, and the driver calls AsyncLLM's
`init_weight_transfer_engine` / `start_weight_update` / `update_weights` / `finish_weight_update`.

vLLM's own "nccl" backend is CUDA-only (its communicator and packing run on CUDA streams); this one
uses `torch.distributed` process groups (`agentrl.weights.collective`): gloo on CPU, NCCL on GPU. Loading is
vLLM's layerwise in-place reload, the same one `reload_weights` (the file path) runs, so kernels that
repack weights (the CPU backend's) see checkpoint-format tensors either way.

`register` is a vLLM general plugin (entry point in pyproject.toml): vLLM runs it in its engine-core
and worker processes, before the worker builds the backend named in its config.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

BACKEND = "agentrl"


def register() -> None:
    """Add the backend to vLLM's registry (plugins may be loaded more than once in a process). Also
    keeps vLLM's own gloo groups on loopback (agentrl.weights.collective.keep_gloo_on_loopback): vLLM loads
    plugins in the process that starts an engine before it starts the engine core, which inherits it."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from agentrl.weights.collective import keep_gloo_on_loopback

    keep_gloo_on_loopback()

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "AgentrlWeightTransferEngine")


@dataclass
class InitInfo:
    master_address: str
    master_port: int
    rank_offset: int  # this engine's first worker's rank in the group (the sender is rank 0)
    world_size: int
    timeout_s: float
    bucket_bytes: int
    backend: str = "gloo"  # the sender's: gloo (buffers in host memory) or nccl (on this worker's GPU)
    # The group's key (hex; agentrl.weights.collective, "Who can reach it"): kept out of reprs and logs.
    secret: str = field(default="", repr=False)
    local: bool = True  # every peer on this node: this worker's sockets listen on loopback only
    interface: str = ""  # otherwise, the interface to listen on ("" = its address on the route to the sender)


@dataclass
class UpdateInfo:
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


class AgentrlWeightTransferEngine(WeightTransferEngine):
    init_info_cls = InitInfo
    update_info_cls = UpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: torch.distributed.ProcessGroup | None = None
        self.bucket_bytes = 0
        self.wire = torch.device("cpu")  # where received buffers live: the group's device
        self._staged: Future | None = None  # the background receive of the next push (`stage`)

    def init_transfer_engine(self, init_info: InitInfo) -> None:
        from agentrl.weights.collective import Access, join

        self.shutdown()  # a new group replaces the old one (a restarted sender, a failed push)
        rank = init_info.rank_offset + self.parallel_config.rank
        self.wire = torch.device(self.device) if init_info.backend == "nccl" else torch.device("cpu")
        self.group = join(None, rank, init_info.world_size, init_info.timeout_s, self.wire,
                          Access.from_info(init_info))
        self.bucket_bytes = init_info.bucket_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def _metas(self, update_info: UpdateInfo):
        from agentrl.weights.buckets import TensorMeta, plan_buckets

        if self.group is None:
            raise RuntimeError("agentrl weight transfer: no group (init_weight_transfer_engine first)")
        metas = [TensorMeta(n, d, tuple(s)) for n, d, s in
                 zip(update_info.names, update_info.dtype_names, update_info.shapes)]
        return metas, plan_buckets(metas, self.bucket_bytes)

    def stage(self, update_info: dict[str, Any]) -> bool:
        """Over gloo, receive the next push into buffers of its own on a background thread while the worker
        keeps generating, so the pause covers only the load (a CPU has the memory for a second copy and
        no spare link to hide the transfer behind; on GPU the broadcast lands in HBM at NVLink speed and
        is received in the pause, without a second copy). Returns whether it is staging."""
        from agentrl.weights.collective import receive

        if self.wire.type != "cpu":
            return False
        metas, buckets = self._metas(self.parse_update_info(update_info))
        pool = ThreadPoolExecutor(1, thread_name_prefix="agentrl-weights")
        self._staged = pool.submit(lambda: list(receive(self.group, metas, buckets, self.wire)))
        pool.shutdown(wait=False)
        return True

    def wait_staged(self) -> None:
        """Block until the staged receive is complete; raise (and forget it) if it failed, before any
        weight has been touched."""
        if self._staged is not None:
            try:
                self._staged.result()
            except BaseException:
                self._staged = None
                raise

    def receive_weights(self, update_info: UpdateInfo) -> None:
        from agentrl.weights.collective import receive

        staged, self._staged = self._staged, None
        if staged is not None:
            parts = staged.result()
        else:
            metas, buckets = self._metas(update_info)
            parts = receive(self.group, metas, buckets, self.wire)
        # One load_weights call for the whole push: each call walks the model's module tree (a tenth of
        # a second for SmolLM2 on CPU), and buckets are consumed as the generator reaches them.
        self.model.load_weights(pair for pairs in parts for pair in pairs)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronises the accelerator afterwards, which a CPU build has no use for.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        # Dropped, not shut down: a staged receive may still hold the group on its thread until the
        # group's timeout, and a shutdown would block this worker (and generation) until then.
        self.group = None
