"""The actor's weights leaving the learner: as a CPU state dict for a weight push, and as a Hugging
Face folder at the end of a run."""

from __future__ import annotations

import torch


def full_state_dict_cpu(module: torch.nn.Module, zero_stage: int, lora: bool, clone: bool = True) -> dict[str, torch.Tensor]:
    """Full float32 weights on CPU (gathered under ZeRO-3; LoRA merged, keyed like the base model).
    A tied lm_head is sent as its own copy: vLLM's in-place reload keeps the old head if it is left out.
    `clone=False` lets float32 CPU tensors alias the live parameters (one copy less for a weight
    push that writes them out before the next step); gathered ZeRO-3 shards are always copied."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=zero_stage == 3):
        if lora:
            from agentrl.learner.lora import merged_state_dict

            return merged_state_dict(module)
        copy = clone or zero_stage == 3
        return {k: _cpu_float32(v, copy) for k, v in module.state_dict().items()}


def save_hf_folder(model_path: str, state: dict[str, torch.Tensor], out_dir: str, tokenizer) -> None:
    """`state` on the architecture, config and chat template of `model_path`, saved as safetensors."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)  # config + template
    model.load_state_dict(state, strict=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _cpu_float32(t: torch.Tensor, copy: bool) -> torch.Tensor:
    out = t.detach().to("cpu", torch.float32).contiguous()
    return out.clone() if copy and out.data_ptr() == t.data_ptr() else out
