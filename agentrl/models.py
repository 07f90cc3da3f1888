"""The learner's DeepSpeed engines, built from Hugging Face folders: the actor (optionally with LoRA
and gradient checkpointing), the frozen reference, and the critic. No training logic here.

Every trained engine gets its own AdamW over its trainable parameters and a warmup + decay
learning-rate schedule (`lr_factor`, a pure function so it is tested by the number). Optimizer
offload keeps torch's AdamW (`zero_force_ds_cpu_optimizer: false`): DeepSpeed's CPU Adam is a C++
op that would be compiled on first use, which costs minutes on a fresh machine.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from agentrl.config import OptimConfig


def lr_factor(step: int, kind: str, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based).

    Warmup is linear from lr / warmup at step 0 to the peak at step warmup - 1 (step 0 is not wasted
    on lr 0). After it, "linear" and "cosine" decay from the peak to min_ratio * peak at step `total`.
    """
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    if kind == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr scheduler {kind!r}")


def ds_config(opt: OptimConfig, micro_batch_size: int, grad_accum: int, bf16: bool,
              stage: int | None = None, offload_params: bool | None = None) -> dict[str, Any]:
    stage = opt.zero_stage if stage is None else stage
    zero: dict[str, Any] = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if opt.offload_optimizer and stage >= 1:
        zero["offload_optimizer"] = {"device": "cpu"}
    if (opt.offload_params if offload_params is None else offload_params) and stage == 3:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": opt.grad_clip,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def trained_engine(module: torch.nn.Module, opt: OptimConfig, micro_batch_size: int, grad_accum: int,
                   bf16: bool, total_steps: int):
    """A DeepSpeed engine with AdamW over the trainable parameters and the configured schedule."""
    import deepspeed

    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay)
    schedule: Callable[[int], float] = lambda step: lr_factor(  # noqa: E731
        step, opt.scheduler, opt.warmup_steps, total_steps, opt.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                      config=ds_config(opt, micro_batch_size, grad_accum, bf16))
    return engine


def eval_engine(module: torch.nn.Module, opt: OptimConfig, micro_batch_size: int, offload: bool):
    """A frozen, eval-only engine: ZeRO-3 if the trained model is ZeRO-3 or offload is asked, else ZeRO-0."""
    import deepspeed

    module = module.eval().requires_grad_(False)
    stage = 3 if opt.zero_stage == 3 or offload else 0
    config = ds_config(opt, micro_batch_size, 1, False, stage=stage, offload_params=offload)
    config.pop("zero_force_ds_cpu_optimizer")
    engine, *_ = deepspeed.initialize(model=module, config=config)
    return engine


def load_causal_lm(path: str, opt: OptimConfig) -> torch.nn.Module:
    """The actor: float32 weights (DeepSpeed casts for bf16), checkpointing and LoRA as configured."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return _prepare_trainable(model, opt, task_type="CAUSAL_LM")


def load_value_model(path: str, opt: OptimConfig) -> torch.nn.Module:
    """The critic: a causal-LM or reward-model body with a scalar value head (`agentrl.critic`)."""
    from agentrl.critic import ValueModel

    return _prepare_trainable(ValueModel.from_pretrained(path), opt, task_type=None)


def _prepare_trainable(model: torch.nn.Module, opt: OptimConfig, task_type: str | None) -> torch.nn.Module:
    if opt.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if getattr(model, "config", None) is not None:
            model.config.use_cache = False
    if opt.lora.rank > 0:
        from agentrl.lora import apply_lora

        model = apply_lora(model, opt.lora.rank, opt.lora.alpha, opt.lora.dropout, opt.lora.target_modules)
    return model
