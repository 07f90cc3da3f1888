"""The methods agentrl adds to each vLLM worker (`worker_extension_cls`): the receiving calls of both
weight paths as one RPC each. vLLM mixes this class into its worker class, so `self` is the worker
(`weight_transfer_engine` is the collective backend of agentrl.weights.receiver, `model_runner` the
worker's model runner). The driver side is agentrl.rollout.engine."""

from __future__ import annotations


class WorkerWeightExtension:
    """vLLM worker extension (mixed into the worker class by vLLM via `worker_extension_cls`)."""

    def agentrl_stage_weights(self, update_info: dict) -> bool:
        """Start receiving the next collective push in the background (`agentrl.weights.receiver`)."""
        return self.weight_transfer_engine.stage(update_info)

    def agentrl_wait_staged(self) -> None:
        self.weight_transfer_engine.wait_staged()

    def agentrl_update_weights(self, update_info: dict) -> None:
        """vLLM's weight-update session (the worker's start / update / finish) in one RPC: each round
        trip to a paused engine costs tens of milliseconds of pause on a busy CPU."""
        self.start_weight_update()
        self.update_weights(update_info)
        self.finish_weight_update()

    def agentrl_load_weights_file(self, path: str) -> int:
        """Reload the weights from a safetensors file the learner wrote (under /dev/shm: a memory
        copy, not a disk read). Tensors are read one at a time as vLLM consumes them."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            self.model_runner.reload_weights(weights_iterator=((n, f.get_tensor(n)) for n in names))
        return len(names)
