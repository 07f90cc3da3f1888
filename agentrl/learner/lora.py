"""LoRA adapters (peft) on the actor or the critic, and the merged full weights for inference engines.

apply_lora wraps a model with peft's LoRA: W x + (alpha / r) * B A x on the target Linear layers, with
A random, B zero (so the wrapped model starts equal to the base) and only A, B trainable.
  * A causal LM gets task type CAUSAL_LM (PeftModelForCausalLM).
  * Any other module, e.g. `agentrl.learner.models.ValueModel`, gets peft's task-agnostic PeftModel:
    PeftModelForCausalLM needs `prepare_inputs_for_generation`, which a critic lacks. The critic's
    `value_head` is listed in `modules_to_save` (a trainable full copy, saved with the adapter) and is
    excluded from the LoRA targets, so the head trains in full while the body trains through LoRA.

merged_state_dict computes W + (alpha / r) * B @ A in float32 from the live tensors, under the base
model's own `state_dict()` keys (no `base_model.model.` prefix, no `.base_layer`), without merging into
the live model: peft's `merge_and_unload` would change the weights being trained.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

ALL_LINEAR = "all-linear"


def apply_lora(model: torch.nn.Module, rank: int, alpha: float, dropout: float = 0.0,
               target_modules: Sequence[str] | str = ALL_LINEAR):
    """Wrap `model` with LoRA adapters and return the peft model. `model` itself is modified: peft injects
    the adapter layers into it and freezes its other parameters (tensors are shared, not copied).

    `target_modules`: module-name suffixes (e.g. ["q_proj", "v_proj"]) or "all-linear" (every Linear but
    the output layer). For a model with a `value_head` (the critic), the head is trained in full instead.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    is_causal_lm = hasattr(model, "prepare_inputs_for_generation") and model.get_output_embeddings() is not None
    has_value_head = isinstance(getattr(model, "value_head", None), torch.nn.Module)
    # A sequence classifier (the reward model): peft's SEQ_CLS trains its `score` head in full.
    is_classifier = not is_causal_lm and isinstance(getattr(model, "score", None), torch.nn.Linear)
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none",
        task_type=TaskType.CAUSAL_LM if is_causal_lm else TaskType.SEQ_CLS if is_classifier else None,
        modules_to_save=["value_head"] if has_value_head else None,
        exclude_modules=["value_head"] if has_value_head else None,
    )
    return get_peft_model(model, config)


def merged_state_dict(peft_model, zero3: bool = False) -> dict[str, torch.Tensor]:
    """Full float32 CPU weights with the active adapters merged, keyed like the base model's `state_dict()`
    (e.g. `model.layers.0.self_attn.q_proj.weight`). The live model is not modified.

    When the base config ties embeddings, `lm_head.weight` is included as its own copy of the (merged)
    input embedding: vLLM's in-place reload keeps the old head if it is left out.
    Under ZeRO-3 (`zero3=True`) the parameters are gathered (a collective: call it on every rank).
    """
    base = peft_model.get_base_model()
    gather = contextlib.nullcontext()
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(peft_model.parameters()), enabled=True)
    out: dict[str, torch.Tensor] = {}
    with gather, torch.no_grad():
        _collect(base, "", out)
    config = getattr(base, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False) and hasattr(base, "get_output_embeddings"):
        names = {id(m): n for n, m in base.named_modules()}
        head, embed = base.get_output_embeddings(), base.get_input_embeddings()
        if head is not None and embed is not None:
            out[f"{names[id(head)]}.weight"] = out[f"{names[id(embed)]}.weight"].clone()
    return out


def _cpu32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32, copy=True)


def _collect(module: torch.nn.Module, prefix: str, out: dict[str, torch.Tensor]) -> None:
    """Walk the module tree the way `state_dict()` does (parameters, persistent buffers, children),
    replacing each LoRA layer by its merged base layer and each modules_to_save wrapper by its active copy."""
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import ModulesToSaveWrapper

    if isinstance(module, LoraLayer):
        _collect(module.get_base_layer(), prefix, out)
        _add_lora_delta(module, prefix, out)
        return
    if isinstance(module, ModulesToSaveWrapper):
        active = module.active_adapters[0] if module.active_adapters else None
        use_copy = not module.disable_adapters and active in module.modules_to_save
        _collect(module.modules_to_save[active] if use_copy else module.original_module, prefix, out)
        return
    for name, param in module._parameters.items():
        if param is not None:
            out[prefix + name] = _cpu32(param)
    for name, buf in module._buffers.items():
        if buf is not None and name not in module._non_persistent_buffers_set:
            out[prefix + name] = _cpu32(buf)
    for name, child in module._modules.items():
        if child is not None:
            _collect(child, f"{prefix}{name}.", out)


def _add_lora_delta(layer, prefix: str, out: dict[str, torch.Tensor]) -> None:
    """Make out[prefix.weight] the weight the layer's forward applies: the base weight plus the active,
    not yet merged adapters' deltas; with adapters disabled, the base weight alone (peft's forward then
    unmerges adapters merged into it)."""
    if layer.disable_adapters:
        terms = [(adapter, -1.0) for adapter in layer.merged_adapters]
    else:
        terms = [(adapter, 1.0) for adapter in layer.active_adapters if adapter not in layer.merged_adapters]
    for adapter, sign in terms:
        if getattr(layer, "use_dora", {}).get(adapter, False):
            raise NotImplementedError("merged_state_dict does not support DoRA adapters")
        delta = _lora_delta(layer, adapter)
        if delta is None:
            continue
        out[prefix + "weight"] += sign * delta
        if getattr(layer, "lora_bias", {}).get(adapter, False):
            out[prefix + "bias"] += sign * _cpu32(layer.lora_B[adapter].bias) * layer.scaling[adapter]


def _lora_delta(layer, adapter: str) -> torch.Tensor | None:
    """float32 CPU (alpha / r) * B @ A (Linear; transposed for fan_in_fan_out), (alpha / r) * (B @ A)^T
    (Embedding), or peft's own get_delta_weight for other layer kinds (conv); None if the adapter is not here."""
    scaling = layer.scaling.get(adapter)
    if adapter in layer.lora_A:
        if not isinstance(layer.lora_A[adapter], torch.nn.Linear):
            return layer.get_delta_weight(adapter).detach().to("cpu", torch.float32)
        delta = layer.lora_B[adapter].weight.detach().float() @ layer.lora_A[adapter].weight.detach().float()
        if getattr(layer, "fan_in_fan_out", False):
            delta = delta.T
    elif adapter in getattr(layer, "lora_embedding_A", {}):
        delta = (layer.lora_embedding_B[adapter].detach().float() @ layer.lora_embedding_A[adapter].detach().float()).T
    else:
        return None
    return delta.cpu() * scaling
