"""DeepSpeed actor engine: proximal logprobs, policy-loss steps, weight snapshots. No RL math here:
advantages and losses come from `agentrl.algo` registries chosen by config.

Runs in one process with gloo on CPU (or on CUDA when present). `step` is synchronous and is
called from a worker thread so the event loop keeps generating while the learner works.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from dataclasses import dataclass

import torch

from agentrl.algo import (POLICY_LOSSES, PolicyLossConfig, PolicyLossInputs, aggregate, correction_metrics,
                          importance_weights, kl_estimate, masked_mean)
from agentrl.config import AlgoConfig, LearnerConfig
from agentrl.types import TrainBatch

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_dist() -> None:
    """One-process gloo group, as DeepSpeed expects a distributed context."""
    import deepspeed
    import deepspeed.ops

    for key, val in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, val)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if int(os.environ["WORLD_SIZE"]) == 1:
        # The shared-memory allreduce op only helps several ranks and costs a ~40 s C++ build.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if int(os.environ["WORLD_SIZE"]) == 1:
            # An in-memory store: no TCP port to pick, so no race with vLLM's or a server's sockets.
            torch.distributed.init_process_group(backend=backend, store=torch.distributed.HashStore(),
                                                 rank=0, world_size=1)
        else:
            torch.distributed.init_process_group(backend=backend)
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())


def token_logprobs(logits_BTV: torch.Tensor, ids_BT: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T) log p(ids[t] | ids[:t]); position 0 has no prediction and is 0."""
    logits = logits_BTV[:, :-1].float() / temperature
    target = ids_BT[:, 1:]
    picked = torch.gather(logits, -1, target.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


@dataclass
class StepMetrics:
    loss: float
    grad_norm: float
    step_time_s: float
    n_episodes: int
    n_tokens: int
    policy: dict[str, float]


class Learner:
    def __init__(self, model_path: str, cfg: LearnerConfig, algo: AlgoConfig, temperature: float,
                 batch_size: int) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(cfg.num_threads)
        init_single_process_dist()
        self.cfg, self.algo, self.temperature = cfg, algo, temperature
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        rows_per_mini = math.ceil(batch_size / cfg.mini_batches)
        self.micro_per_mini = math.ceil(rows_per_mini / cfg.micro_batch_size)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": self.micro_per_mini,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage, "stage3_param_persistence_threshold": 0},
            "bf16": {"enabled": dtype == torch.bfloat16},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.device = self.engine.device
        self.reference = self._build_reference(model_path, ds_config) if algo.kl_coef > 0 else None
        self.loss_cfg = PolicyLossConfig(
            clip_low=algo.clip_low, clip_high=algo.clip_high, correction=algo.correction,
            correction_level=algo.correction_level, is_low=algo.is_low, is_high=algo.is_high,
            agg=algo.agg, entropy_coef=algo.entropy_coef)
        self.loss_fn = POLICY_LOSSES[algo.policy_loss]
        self.version = 0

    @staticmethod
    def _build_reference(model_path: str, actor_ds_config: dict):
        """Frozen copy of the starting weights in an eval-only engine: ZeRO-3 if the actor is, else 0."""
        import deepspeed
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval().requires_grad_(False)
        stage = 3 if actor_ds_config["zero_optimization"]["stage"] == 3 else 0
        config = {**actor_ds_config, "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
        engine, *_ = deepspeed.initialize(model=ref, config=config)
        return engine

    def _forward_logprobs(self, batch: TrainBatch, rows: slice, engine=None) -> torch.Tensor:
        ids = batch.input_ids[rows].to(self.device)
        attn = batch.attention_mask[rows].to(self.device)
        logits = (engine or self.engine)(input_ids=ids, attention_mask=attn).logits
        return token_logprobs(logits, ids, self.temperature)

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """(B, T) log pi_theta for the current weights, computed in micro-batches."""
        self.engine.eval()
        out = [self._forward_logprobs(batch, slice(i, i + self.cfg.micro_batch_size)).cpu()
               for i in range(0, batch.size, self.cfg.micro_batch_size)]
        return torch.cat(out) * batch.loss_mask

    def _micro_slices(self, rows: range) -> list[slice]:
        """Exactly `micro_per_mini` slices (DeepSpeed counts micro-steps for accumulation); empty ones are skipped."""
        size = math.ceil(len(rows) / self.micro_per_mini) if len(rows) else 0
        return [slice(rows.start + k * size, min(rows.start + (k + 1) * size, rows.stop))
                for k in range(self.micro_per_mini)]

    def _micro_step(self, batch: TrainBatch, rows: slice, old_logp: torch.Tensor, weight: float):
        logp = self._forward_logprobs(batch, rows)
        mask = batch.loss_mask[rows].to(self.device)
        inputs = PolicyLossInputs(
            logp_BT=logp * mask, old_logp_BT=old_logp[rows].to(self.device),
            behav_logp_BT=batch.behav_logprobs[rows].to(self.device),
            advantages_BT=batch.advantages[rows].to(self.device), mask_BT=mask)
        loss, metrics = self.loss_fn(inputs, self.loss_cfg)
        if self.reference is not None:
            with torch.no_grad():
                ref_logp = self._forward_logprobs(batch, rows, self.reference)
            kl_BT = kl_estimate(inputs.logp_BT, ref_logp * mask, self.algo.kl_estimator)
            loss = loss + self.algo.kl_coef * aggregate(kl_BT, mask, self.algo.agg)
            metrics = {**metrics, "kl_ref": float(masked_mean(kl_BT.detach(), mask))}
        # DeepSpeed would divide by the accumulation steps; we weight each micro-batch by its share
        # of the mini-batch's tokens (or rows) instead, so ragged micro-batches aggregate exactly.
        self.engine.backward(loss * weight, scale_wrt_gas=False)
        return loss.item() * weight, metrics

    def staleness_metrics(self, batch: TrainBatch, old_logp: torch.Tensor) -> dict[str, float]:
        """Correction diagnostics per staleness bucket (learner version minus token version), e.g.
        `stale2/is_ess`: how far behaviour and proximal policies drift as samples age."""
        out: dict[str, float] = {}
        token_staleness = self.version - batch.versions
        for s in sorted(set(token_staleness[batch.loss_mask > 0].tolist())):
            mask = batch.loss_mask * (token_staleness == s)
            iw = importance_weights(old_logp, batch.behav_logprobs, mask, self.algo.correction,
                                    self.algo.correction_level, self.algo.is_low, self.algo.is_high)
            for key, val in correction_metrics(iw, old_logp, batch.behav_logprobs, mask).items():
                if key in ("is_ess", "is_corrected_frac", "mismatch_k1", "mismatch_abs"):
                    out[f"stale{s}/{key}"] = val
            out[f"stale{s}/tokens"] = float(mask.sum())
        return out

    def step(self, batch: TrainBatch) -> list[StepMetrics]:
        """Train on one batch: recompute pi_prox, then `mini_batches` optimizer steps.
        Returns one StepMetrics per optimizer step; `self.version` counts optimizer steps."""
        old_logp = self.logprobs(batch) if self.algo.mode == "decoupled" else batch.behav_logprobs
        buckets = self.staleness_metrics(batch, old_logp)
        self.engine.train()
        results = []
        per_mini = math.ceil(batch.size / self.cfg.mini_batches)
        for start in range(0, batch.size, per_mini):
            t0 = time.perf_counter()
            rows = range(start, min(start + per_mini, batch.size))
            slices = self._micro_slices(rows)
            by_tokens = self.algo.agg == "token_mean"
            total = float(batch.loss_mask[start:rows.stop].sum()) if by_tokens else float(len(rows))
            loss_sum, metric_rows = 0.0, []
            grad_norm = float("nan")
            for k, sl in enumerate(slices):
                n = float(batch.loss_mask[sl].sum()) if by_tokens else float(sl.stop - sl.start)
                if sl.stop <= sl.start or n == 0:
                    self.engine.backward(self._zero_loss(), scale_wrt_gas=False)
                else:
                    loss_val, metrics = self._micro_step(batch, sl, old_logp, n / max(total, 1.0))
                    loss_sum += loss_val
                    metric_rows.append((n, metrics))
                if k == len(slices) - 1 and self.cfg.zero_stage == 0:
                    grad_norm = self._local_grad_norm()  # DeepSpeed records it only for ZeRO >= 1
                self.engine.step()
            if self.cfg.zero_stage > 0:
                grad_norm = float(self.engine.get_global_grad_norm() or float("nan"))
            self.version += 1
            results.append(StepMetrics(
                loss=loss_sum, grad_norm=grad_norm,
                step_time_s=time.perf_counter() - t0, n_episodes=len(rows),
                n_tokens=int(batch.loss_mask[start:rows.stop].sum()), policy={**_weighted(metric_rows), **buckets}))
        return results

    def _local_grad_norm(self) -> float:
        grads = [p.grad.detach().float() for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0

    def _zero_loss(self) -> torch.Tensor:
        """A loss of exactly 0 that still touches every parameter, for an empty micro-step."""
        return sum(p.sum() * 0.0 for p in self.engine.module.parameters())

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        """Full float32 weights on CPU (gathered under ZeRO-3). A tied lm_head is sent as its own copy:
        vLLM's in-place reload keeps the old head if it is left out."""
        import deepspeed

        module = self.engine.module
        params = list(module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.cfg.zero_stage == 3):
            sd = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in module.state_dict().items()}
        return sd

    def save(self, out_dir: str, tokenizer) -> None:
        import deepspeed

        module = self.engine.module
        with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=self.cfg.zero_stage == 3):
            module.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)


def _weighted(rows: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Combine per-micro-batch metrics, weighted by their token (or row) counts; max/min stay max/min."""
    if not rows:
        return {}
    total = sum(n for n, _ in rows) or 1.0
    out: dict[str, float] = {}
    for key in rows[0][1]:
        vals = [m[key] for _, m in rows if key in m]
        if key.endswith("_max"):
            out[key] = max(vals)
        elif key.endswith("_min"):
            out[key] = min(vals)
        else:
            out[key] = sum(n * m.get(key, 0.0) for n, m in rows) / total
    return out
