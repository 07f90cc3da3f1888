"""Exponential moving average of the trained weights, kept in float32 on the CPU.

    shadow_k = decay * shadow_{k-1} + (1 - decay) * theta_k,    shadow_0 = theta_0

The shadow covers every parameter of the module (frozen ones included, so the saved folder is a full
model), under `named_parameters()` names; a tied parameter (lm_head = embed_tokens) appears once, under
its first name, as in `named_parameters()`. It costs 4 bytes per parameter of host memory on every rank.

Under DeepSpeed ZeRO-3 (`zero3=True`) each parameter is gathered on its own
(`deepspeed.zero.GatheredParameters`, read-only) while it is read, so the peak extra device memory is
one parameter rather than the whole model. Gathering is a collective: every rank must call
`__init__` and `update`. Pass the bare module (`engine.module`), not the DeepSpeed engine, so names
carry no `module.` prefix.
"""

from __future__ import annotations

import contextlib
import os

import torch


class ModelEMA:
    def __init__(self, module: torch.nn.Module, decay: float, zero3: bool = False) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
        self.decay, self.zero3 = decay, zero3
        self.num_updates = 0
        self.shadow: dict[str, torch.Tensor] = {}
        for name, param in module.named_parameters():
            with self._gathered(param):
                self.shadow[name] = param.detach().to("cpu", torch.float32, copy=True)

    def _gathered(self, param: torch.nn.Parameter):
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters([param], enabled=True)

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        """shadow = decay * shadow + (1 - decay) * param, for every parameter of `module`."""
        for name, param in module.named_parameters():
            if name not in self.shadow:
                raise KeyError(f"parameter {name!r} is not in the EMA (built from a different module?)")
            with self._gathered(param):
                value = param.detach().to("cpu", torch.float32)
            self.shadow[name].mul_(self.decay).add_(value, alpha=1.0 - self.decay)
        self.num_updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """{full parameter name: float32 CPU tensor}; the live shadow tensors, not copies."""
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.shadow) ^ set(state)
        if missing:
            raise KeyError(f"EMA state keys differ: {sorted(missing)[:5]}")
        for name, value in state.items():
            self.shadow[name].copy_(value)

    def save_pretrained(self, model_template, out_dir: str | os.PathLike, tokenizer=None) -> None:
        """Write a normal Hugging Face folder holding the EMA weights (float32), reloadable with
        `AutoModelForCausalLM.from_pretrained`. `model_template` is any instance of the model class whose
        `named_parameters()` match the shadow (e.g. the trained module; under ZeRO-3 its partitioned
        parameters are not read); its config and generation config are written alongside.
        Only rank 0 writes when torch.distributed is initialised."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        model_template.save_pretrained(out_dir, state_dict=self.state_dict())
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)
